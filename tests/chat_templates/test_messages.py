"""Checking conversations: OpenAI's message format with text parts; each problem one line naming the message."""

from __future__ import annotations

import pytest

from qkv.chat_templates import check_messages
from qkv.errors import QkvError

BAD = [
    ("Hello", r"^messages must be a list of .* objects, got str: write e\.g\. \[\{"),
    ({"role": "user", "content": "Hi"}, r"^messages must be a list of .*, got dict"),
    (None, r"^messages must be a list of .*, got NoneType"),
    ([], r"^the conversation is empty: give at least one message"),
    (["Hi"], r"^messages\[0\] is a str, not an object: write \{'role': 'user', 'content': \.\.\.\}$"),
    ([{"content": "Hi"}], r"^messages\[0\] has no 'role': give each message a role such as 'system', 'user'"),
    ([{"role": 3, "content": "Hi"}], r"^messages\[0\]\.role is 3: the roles are system, user, assistant, tool"),
    ([{"role": "", "content": "Hi"}], r"^messages\[0\]\.role is '': the roles are system, user"),
    ([{"role": "robot", "content": "Hi"}], r"^messages\[0\]\.role is 'robot': the roles are system, user"),
    ([{"role": "user", "content": "a"}, {"role": "user"}], r"^messages\[1\] \(user\) has no 'content': give the"),
    ([{"role": "user", "content": None}], r"^messages\[0\] \(user\) has no 'content'"),
    ([{"role": "user", "content": 7}], r"^messages\[0\]\.content is a int: give a string, or a list of \{'type'"),
    ([{"role": "user", "content": {"text": "Hi"}}], r"^messages\[0\]\.content is a dict: give a string"),
    ([{"role": "user", "content": ["Hi"]}], r"^messages\[0\]\.content\[0\] is a str: write each part as \{'type'"),
    (
        [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}]}],
        r"^messages\[0\]\.content\[1\] has type 'image_url': this model reads text only; send \{'type': 'text'",
    ),
    ([{"role": "user", "content": [{"text": "a"}]}], r"^messages\[0\]\.content\[0\] has no 'type': this model"),
    ([{"role": "user", "content": [{"type": "text"}]}], r"^messages\[0\]\.content\[0\] has no string 'text'"),
    ([{"role": "user", "content": [{"type": "text", "text": 1}]}], r"^messages\[0\]\.content\[0\] has no string"),
]


@pytest.mark.parametrize(("messages", "match"), BAD)
def test_bad_messages_are_one_line_each(messages, match) -> None:
    with pytest.raises(QkvError, match=match) as error:
        check_messages(messages)
    assert "\n" not in str(error.value)


def test_good_messages_become_plain_strings_with_their_other_keys() -> None:
    messages = [
        {"role": "system", "content": "Be brief.", "name": None},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "name": "Ann"},
        {"role": "assistant", "content": "", "reasoning_content": "think", "tool_calls": [{"id": ("x", 1)}]},
    ]
    assert check_messages(messages) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "a\nb", "name": "Ann"},
        {"thinking": "think", "role": "assistant", "content": "", "reasoning_content": "think",
         "tool_calls": [{"id": ("x", 1)}]},
    ]  # fmt: skip
    assert messages[1]["content"][0] == {"type": "text", "text": "a"}  # the caller's messages are left as they were
