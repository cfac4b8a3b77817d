"""Prompt-lookup decoding: drafts copied from the text itself, checked by the model in one step.

A model asked to quote, summarise or edit a text it was given writes runs of that text. Prompt lookup
(Saxena 2023; Hugging Face's ``prompt_lookup_num_tokens``) guesses the next tokens without a second model: it
finds the text's last n tokens (n = 3, then 2, then 1) earlier in the text (the prompt and what was generated)
and proposes the k tokens that followed their first occurrence. The engine (:mod:`qkv.decoding.engine`) feeds
the row's last token and the k drafted ones in one step, each at its own position, which gives the model's
next-token logits after each of them. Greedy decoding then keeps the drafted tokens as long as each one is the
argmax at its place, and adds the argmax where the first one differs (or after the last). Every kept token is
the one greedy decoding would have chosen one step at a time, so the text is the same; a step reads the weights
once and yields 1 to k + 1 tokens.

Checking a drafted token costs a row of arithmetic (on SmolLM2 int4, 11 rows cost about 5 single steps), so
drafts that keep failing slow decoding down. As Hugging Face's assisted generation does, a row's draft length
starts at k, grows by 2 after a draft kept whole (up to k) and shrinks by 1 after one that failed (down to 1).

    generate(model, ids, max_new_tokens=200, temperature=0, prompt_lookup=10)   # SamplingParams(prompt_lookup=10)
"""

from __future__ import annotations

import torch

from qkv.errors import QkvError

MAX_NGRAM = 3  # the longest run of last tokens looked up (the original method's; Hugging Face's default is 2)


class Lookup:
    """Where each run of 1 to :data:`MAX_NGRAM` tokens of a text first occurs, kept up to date as the text grows."""

    def __init__(self, tokens: list[int], size: int = 1) -> None:
        self.size = self.most = size  # the next draft's length, and its largest
        self.tokens: list[int] = []
        self.after: dict[tuple[int, ...], int] = {}  # n-gram -> the index right after its first occurrence
        self.extend(tokens)

    def extend(self, tokens: list[int]) -> None:
        for token in tokens:
            self.tokens.append(token)
            end = len(self.tokens)
            for n in range(1, min(MAX_NGRAM, end) + 1):
                self.after.setdefault(tuple(self.tokens[end - n :]), end)

    def checked(self, drafted: int, kept: int) -> None:
        """A draft of ``drafted`` tokens of which ``kept`` were kept: the next one grows by 2 or shrinks by 1."""
        self.size = min(self.most, self.size + 2) if kept == drafted else max(1, self.size - 1)

    def draft(self, k: int) -> list[int]:
        """Up to ``k`` tokens that followed the earliest earlier occurrence of the text's last 3 (else 2, else 1)
        tokens; none when they never occurred before."""
        end = len(self.tokens)
        for n in range(min(MAX_NGRAM, end - 1), 0, -1):
            at = self.after.get(tuple(self.tokens[end - n :]), end)
            if at < end:  # an occurrence before the one that ends the text
                return self.tokens[at : at + k]
        return []


def check_cached(params, use_cache: bool) -> None:
    """A QkvError where prompt lookup is asked of decoding without a KV cache: the drafts are checked in a step over
    the cache, and ``use_cache=False`` recomputes every step, so they would be silently ignored."""
    if params.prompt_lookup and not use_cache:
        raise QkvError(
            f"prompt_lookup={params.prompt_lookup} checks its drafts in a step over the KV cache, and "
            "use_cache=False (--no-cache) recomputes every step: leave out one of the two"
        )


def draft_for(engine, row) -> list[int]:
    """Row ``row``'s drafted tokens this step: none without prompt lookup, past the context (the window slides)
    or where no room is left (its last tokens, or its cache row)."""
    params = row.request.params
    if row.lookup is None or len(row.tokens) > engine.context:
        return []
    room = min(row.lookup.size, params.max_new_tokens - row.made - 1, engine.max_len - len(row.tokens),
               engine.context - len(row.tokens))  # fmt: skip
    return row.lookup.draft(room) if room > 0 else []


def checked_step(engine, rows: list, drafts: list[list[int]]) -> list:
    """One step of the engine's running ``rows`` (row i in slot i), each feeding its last token and its draft:
    every row's outputs, in order (one or more per row); the finished rows leave."""
    outputs, finished = [], []
    scored, picked = _logits(engine, rows, drafts)
    for slot, (row, draft, scores, picks) in enumerate(zip(rows, drafts, scored, picked, strict=True)):
        for j in range(len(draft) + 1):  # scores[j]: the logits after the last token and draft[:j]
            out = engine._choose(row, scores[j : j + 1], None if picks is None else picks[j])
            outputs.append(out)
            if out.error is not None or out.finish_reason is not None or j == len(draft) or out.token != draft[j]:
                break
        if draft:
            row.lookup.checked(len(draft), j)  # j drafted tokens were kept
        if outputs[-1].error is not None or outputs[-1].finish_reason is not None:
            finished.append(slot)
    for slot in reversed(finished):  # reversed: leaving moves later rows
        engine._drop(slot)
    return outputs


def _logits(engine, rows: list, drafts: list[list[int]]) -> tuple[list, list]:
    """Each row's logits (1 + its draft's length, V): after its last token, then after each drafted token; and, in
    the native step, their argmaxes (-1: NaN or inf) from the step's own scan (else None per row)."""
    if engine.mode == "native":  # one call: a row's tokens share its cache row (qkv.decoding.native_step)
        fed = [[row.tokens[-1], *draft] for row, draft in zip(rows, drafts, strict=True)]
        ids = torch.tensor([token for tokens in fed for token in tokens])
        positions = torch.tensor(
            [len(row.tokens) - 1 + j for row, t in zip(rows, fed, strict=True) for j in range(len(t))]
        )
        slots = torch.tensor([slot for slot, tokens in enumerate(fed) for _ in tokens])
        picks = torch.empty(len(ids), dtype=torch.long)
        logits = engine._fast_step().native()(ids, positions, engine.buffer[:, : len(rows)], slots, argmax=picks)
        sizes = [len(tokens) for tokens in fed]
        return list(logits.split(sizes)), [part.tolist() for part in picks.split(sizes)]
    single = engine._cached_step(rows)[0]  # the other strategies: the usual step, the model's forward for drafts
    out = [single[i : i + 1] for i in range(len(rows))]
    for slot, (row, draft) in enumerate(zip(rows, drafts, strict=True)):
        if draft:
            cache = engine.model.new_cache(engine.max_len).use(engine.buffer[:, slot : slot + 1])
            cache.length = len(row.tokens) - 1
            ids = torch.tensor([[row.tokens[-1], *draft]], device=engine.device)
            out[slot] = engine.model(ids, cache=cache)[0]  # (1 + k, V)
    return out, [None] * len(rows)
