"""Simulated Jetson boards: a real sshd per board on 127.0.0.1, a board root with a Jetson's
identity files and an INA3221/INA238 power tree that follows the board's CPU load, and a
`systemctl` stand-in so services can run. `edgekit sim up|status|down` drives them; the tests'
`sim_boards` fixture (tests/conftest.py) too.

    <sim dir>/state.json          pids, ports, dirs (edgekit.sim.state)
    <sim dir>/client/id_ed25519   the key every board accepts
    <sim dir>/power.log           the power updater (edgekit.sim.power)
    <sim dir>/sim-K/root          what / is on the board ($EDGEKIT_BOARD_ROOT; edgekit.sim.rootfs)
    <sim dir>/sim-K/base          the board file's `base`
    <sim dir>/sim-K/bin           systemctl, journalctl, nvpmodel stand-ins (first on the board's PATH)
    <sim dir>/sim-K/ssh           sshd_config, host key, pid file; sshd.log next to it
    <sim dir>/sim-K/power_trace.json   optional scripted total power (see edgekit.sim.power)
    <sim dir>/sim-K/thermal_trace.json optional scripted temperatures: past 95 °C the board throttles its CPU caps
"""
