"""Lookup `edgekit_fleet`: the `edgekit_fleet` variable the roles need, from the installed edgekit.

`edgekit fleet` passes it in its plan (-e @plan.json); a playbook of the fleet owner's own gets it from
the roles' defaults, which call this lookup, so edgekit's agent (its zipapp), unit names and health-check
settings are always the installed edgekit's (edgekit.fleet.plan.fleet_vars), never a copy:

    edgekit_fleet: "{{ lookup('edgekit.fleet.edgekit_fleet', health_timeout=30) }}"

A rollout's blobs and release plans are not in it: only `edgekit fleet rollout` computes those.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase

DOCUMENTATION = """
    name: edgekit_fleet
    short_description: edgekit's agent, unit names and health-check settings
    description:
      - The C(edgekit_fleet) variable of the edgekit.fleet roles, from the edgekit installed in
        Ansible's Python (the edgekit-jetson distribution).
    requirements:
      - edgekit-jetson installed in the Python ansible runs from
    options:
      health_timeout:
        description: Seconds a health check waits for the server to answer.
        type: float
        default: 180
"""

RETURN = """
    _raw:
      description: One dict with C(agent), C(units) and C(health).
      type: list
      elements: dict
"""


class LookupModule(LookupBase):
    def run(self, terms: list[Any], variables: dict[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
        self.set_options(var_options=variables, direct=kwargs)
        try:
            from edgekit.fleet.plan import fleet_vars  # imported here: only playbooks without edgekit's plan pay
        except ImportError as exc:
            raise AnsibleError("The edgekit.fleet collection needs edgekit: install edgekit-jetson from edgekit's "
                               "repository at a commit or from a wheel (never the unrelated 'edgekit' from a registry) "
                               f"into the Python ansible runs from ({exc}).") from exc
        return [fleet_vars(float(self.get_option("health_timeout")))]
