"""What edgekit's LiteRT-LM front takes as a chat: an OpenAI ``messages`` conversation of text (the roles
LiteRT-LM renders), the last turn the user's; anything else is a 400 with a sentence, before the engine runs."""

from __future__ import annotations

import pytest

from edgekit.agent.litert_server import conversation_of


def test_a_conversation_of_every_role_passes_with_text_parts_joined() -> None:
    turns = conversation_of([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Name "}, {"type": "text", "text": "a colour."}]},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another?", "name": "ignored"},
    ])
    assert turns == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."},
                     {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another?"}]


@pytest.mark.parametrize(("messages", "says"), [
    ([], "non-empty list"),
    ("hi", "non-empty list"),
    ([{"role": "tool", "content": "42"}], "role must be one of system, user, assistant"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "text parts only"),
    ([{"role": "user", "content": None}], "content must be text"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], "last message must be the user's"),
])
def test_what_it_cannot_render_is_refused_in_one_sentence(messages, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        conversation_of(messages)
