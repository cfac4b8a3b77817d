"""Chat data: the loss falls on the assistant's tokens only, checked token by token against spans found in the text
that transformers renders and offsets that its tokenizer gives; batches, the held-out split and bad lines."""

from __future__ import annotations

import json

import pytest
import torch

import qkv
from qkv.data.chat import IGNORE, ChatBatches, encode_conversations, is_chat_file, pad_batch, read_conversations
from qkv.errors import QkvError

transformers = pytest.importorskip("transformers")

CONVERSATION = [
    {"role": "system", "content": "You answer in verse."},
    {"role": "user", "content": "How is the weather?"},
    {"role": "assistant", "content": "The sun is out, the sky is blue."},
    {"role": "user", "content": "And tomorrow?"},
    {"role": "assistant", "content": "Tomorrow rain will fall on you."},
]
END = "<|im_end|>"


def expected_targets(folder, conversation) -> tuple[list[int], list[bool]]:
    """transformers' ids of the conversation, and which tokens are the assistant's: those whose characters
    overlap an assistant message's content or the end-of-turn token after it (found with str.find)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    text = tokenizer.apply_chat_template(conversation, tokenize=False)
    spans, start = [], 0
    for message in conversation:
        at = text.index(message["content"], start)
        start = at + len(message["content"])
        if message["role"] == "assistant":
            assert text[start : start + len(END)] == END
            spans.append((at, start + len(END)))
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    mask = [s < e and any(s < end and e > start for start, end in spans) for s, e in encoding["offset_mapping"]]
    return encoding["input_ids"], mask


@pytest.mark.parametrize("which", ["tiny", "smollm2"])
def test_only_the_assistant_tokens_are_targets(which, tiny_llama_dir, request) -> None:
    folder = tiny_llama_dir if which == "tiny" else request.getfixturevalue("smol_hf_dir")  # SmolLM2's real template
    bundle = qkv.load(folder)
    ((ids, targets),) = encode_conversations(bundle, [CONVERSATION], seq_len=512, where="test")
    want_ids, assistant = expected_targets(folder, CONVERSATION)
    assert ids.tolist() == want_ids
    for position, (token, is_assistant) in enumerate(zip(want_ids[1:], assistant[1:], strict=True)):
        assert targets[position].item() == (token if is_assistant else IGNORE), position
    learned = bundle.tokenizer.decode([t for t in targets.tolist() if t != IGNORE], skip_special=False)
    assert learned == "The sun is out, the sky is blue.<|im_end|>Tomorrow rain will fall on you.<|im_end|>"


def test_a_conversation_is_cut_to_the_sequence_length(tiny_llama_dir) -> None:
    bundle = qkv.load(tiny_llama_dir)
    ((_, whole),) = encode_conversations(bundle, [CONVERSATION], seq_len=1000, where="test")
    first = int((whole != IGNORE).nonzero()[0])  # the first target that counts
    ((ids, targets),) = encode_conversations(bundle, [CONVERSATION], seq_len=first + 5, where="test")
    assert len(ids) == first + 6 and torch.equal(targets, whole[: first + 5])
    with pytest.raises(QkvError, match=f"conversation 1: its assistant turn starts after the first {first} tokens"):
        encode_conversations(bundle, [CONVERSATION], seq_len=first, where="test")
    with pytest.raises(QkvError, match="conversation 2: .*no assistant message"):
        encode_conversations(bundle, [CONVERSATION, CONVERSATION[:2]], seq_len=1000, where="test")


def test_batches_pad_on_the_right_with_no_target_there() -> None:
    short = (torch.tensor([5, 6, 7]), torch.tensor([IGNORE, 7]))
    long = (torch.tensor([1, 2, 3, 4, 5]), torch.tensor([IGNORE, 3, 4, 5]))
    x, y = pad_batch([short, long], pad_id=0)
    assert x.tolist() == [[5, 6, 0, 0], [1, 2, 3, 4]]
    assert y.tolist() == [[IGNORE, 7, IGNORE, IGNORE], [IGNORE, 3, 4, 5]]


def test_the_last_conversations_are_held_out_and_the_draw_resumes_exactly() -> None:
    examples = [(torch.tensor([i, i + 1, i + 2]), torch.tensor([i + 1, i + 2])) for i in range(10)]
    batches = ChatBatches(examples, pad_id=0, val_fraction=0.2, seed=3)
    assert len(batches.train) == 8 and [int(x[0]) for x, _ in batches.val] == [8, 9]
    batches.train_batch(4)
    state = batches.state_dict()
    expected = batches.train_batch(4)
    again = ChatBatches(examples, pad_id=0, val_fraction=0.2, seed=99)
    again.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(again.train_batch(4), expected, strict=True))
    assert sum(len(x) for x, _ in batches.eval_batches(10, 3)) == 2


def test_chat_files_are_recognised_and_bad_lines_named(tmp_path) -> None:
    good = tmp_path / "chat.jsonl"
    good.write_text(json.dumps({"messages": CONVERSATION}) + "\n\n" + json.dumps({"messages": CONVERSATION}) + "\n")
    assert is_chat_file(good) and not is_chat_file(tmp_path / "absent.jsonl")
    conversations, sha256 = read_conversations(good)
    assert len(conversations) == 2 and len(sha256) == 64
    text = tmp_path / "text.jsonl"
    text.write_text(json.dumps({"text": "plain"}) + "\n")
    assert not is_chat_file(text)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": CONVERSATION}) + "\n{oops\n")
    with pytest.raises(QkvError, match="line 2, is not JSON"):
        read_conversations(bad)
