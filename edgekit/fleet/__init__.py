"""Fleet rollout through Ansible: inventory from the board file, plans computed once, playbooks in ansible/."""
