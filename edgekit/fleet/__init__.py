"""Fleet rollout through Ansible: inventory from the board file, plans computed once, playbooks from the
edgekit.fleet collection in edgekit/data/ansible/."""
