"""Drafter alignment: re-fit a Gemma 4 MTP assistant drafter to the target that is actually deployed.

Self-distillation: the target continues a prompt set; the drafter learns, for every position t, the
target's next-token distributions at t+1…t+K from exactly the inputs it gets at inference (the
target's last hidden state, the target's shared KV, the token embedding, its own recurrent state).
Only the drafter's weights change. Importing this package is cheap: torch loads in the modules
that need it.
"""
