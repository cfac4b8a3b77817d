"""Translation as a task: train an encoder-decoder with teacher forcing and label smoothing, validated by BLEU.

The encoder-decoder is the paper's Transformer, or (``--arch rnnsearch``) RNNSearch, the recurrent model
with additive attention that came before it: same data, tokenizers, batches, loss and evaluation.

Teacher forcing (the notes on Attention Is All You Need, "inference vs training"): the decoder is fed the true
target shifted right after ``<bos>`` and learns to predict each next target token, all positions at once (the
causal mask keeps position t from seeing t+1). Label smoothing (the paper, section 5.4) moves a little
probability mass (0.1) from the correct token to all others, which hurts perplexity but helps BLEU. Validation
reports the loss, and decodes held-out sentences to score them with sacrebleu's BLEU and chrF (and the
exact-match rate, the natural measure for the built-in dates task).

Data: a TSV file (source<TAB>target per line) or two line-aligned files given as ``SRC_FILE,TGT_FILE``;
with no data, the built-in task: human-written dates in English and French to ISO dates. Tokenizers: one
shared vocabulary for both sides (default; then source, target and output embeddings are one matrix, as
in the paper) or one per side (``--shared-vocab false``).

    from qkv.training import TrainConfig, train_translator
    result = train_translator(TrainConfig.create(task="translate"))   # the dates task
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.data.dates import date_pairs, held_out_pairs
from qkv.data.pair_batches import TranslationBatch, TranslationBatches
from qkv.data.parallel import ParallelCorpus, load_parallel, split_parallel
from qkv.decoding.beam_search import beam_search, greedy_decode
from qkv.decoding.translator import corpus_scores
from qkv.errors import QkvError
from qkv.model_dir import CONFIG_FILE, TARGET_TOKENIZER_FILE, TOKENIZER_FILE
from qkv.models import make_config
from qkv.models.base import Model
from qkv.models.config import ModelConfig
from qkv.models.family import TRANSLATOR, build_model, family_of
from qkv.models.memory import check_fits
from qkv.models.rnnsearch import RNNSearchConfig
from qkv.models.transformer import Transformer, TransformerConfig
from qkv.tokenizers import Tokenizer, load_tokenizer, train_tokenizer
from qkv.training.config import TrainConfig, check_arch
from qkv.training.launch import Prepared, run_training
from qkv.training.run import Session, fingerprint

DATES_TRAIN_PAIRS = 60_000
DATES_VAL_PAIRS = 1_000


def translation_loss(logits: Tensor, targets: Tensor, *, pad_id: int, label_smoothing: float = 0.0) -> Tensor:
    """Mean cross-entropy over the non-padding target tokens, with label smoothing."""
    return F.cross_entropy(
        logits.flatten(0, 1), targets.flatten(), ignore_index=pad_id, label_smoothing=label_smoothing
    )


def forward_batch(model: nn.Module, batch: TranslationBatch) -> Tensor:
    """Teacher-forced logits (B, T, V). Targets are right-padded, so the causal mask already keeps real
    positions from seeing padding; no target padding mask is needed (and the fast causal kernel is kept)."""
    return model(batch.src, batch.tgt_in, src_padding_mask=batch.src_padding_mask)


class TranslationTask:
    """Length-bucketed training batches; validation loss, BLEU, chrF and exact match on held-out pairs."""

    def __init__(
        self,
        train: TranslationBatches,
        val: TranslationBatches,
        val_references: list[str],
        target_tokenizer: Tokenizer,
        *,
        device: torch.device,
        label_smoothing: float = 0.1,
        eval_batches: int = 20,
        bleu_sentences: int = 500,
        eval_beam: int = 1,
        metric: str = "bleu",
    ) -> None:
        self.train, self.val, self.val_references = train, val, val_references
        self.target_tokenizer, self.device = target_tokenizer, device
        self.label_smoothing, self.eval_batches = label_smoothing, eval_batches
        self.bleu_sentences, self.eval_beam, self.metric = bleu_sentences, eval_beam, metric
        self.higher_is_better = True
        self.pad_id = train.pad_id
        if not bleu_sentences:  # nothing is decoded: the best model is the one with the lowest loss
            self.metric, self.higher_is_better = "val_loss", False

    def state_dict(self) -> dict[str, Any]:
        return self.train.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.train.load_state_dict(state)

    def train_batch(self, rank: int, world_size: int) -> TranslationBatch:
        return self.train.train_batch(rank=rank, world_size=world_size).to(self.device)

    def loss(self, model: nn.Module, batch: TranslationBatch) -> tuple[Tensor, int]:
        logits = forward_batch(model, batch)
        loss = translation_loss(logits, batch.tgt_out, pad_id=self.pad_id, label_smoothing=self.label_smoothing)
        return loss, batch.n_target_tokens

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, float]:
        total, tokens = 0.0, 0
        for i, batch in enumerate(self.val.eval_batches()):
            if i >= self.eval_batches:
                break
            batch = batch.to(self.device)
            loss = translation_loss(forward_batch(model, batch), batch.tgt_out, pad_id=self.pad_id)
            total += loss.item() * batch.n_target_tokens
            tokens += batch.n_target_tokens
        results = {"val_loss": total / max(tokens, 1)}
        if self.bleu_sentences:
            hypotheses, references = self.decode_validation(model)
            scores = corpus_scores(hypotheses, references)
            exact = sum(h.strip() == r.strip() for h, r in zip(hypotheses, references, strict=True))
            results.update(bleu=scores.bleu, chrf=scores.chrf, exact_match=exact / len(references))
        return results

    def decode_validation(self, model: nn.Module) -> tuple[list[str], list[str]]:
        """Translations of the first ``bleu_sentences`` validation pairs and their references."""
        wanted = min(self.bleu_sentences, self.val.n_pairs)
        outputs: dict[int, list[int]] = {}
        tok = self.target_tokenizer
        bos_id, eos_id = tok.bos_id, tok.eos_id
        assert bos_id is not None and eos_id is not None  # qkv's tokenizers all hold <bos> and <eos>
        translator = cast(Transformer, model)  # the decoders' declared type; RNNSearch answers the same calls
        for batch in self.val.eval_batches():
            keep = batch.indices < wanted
            if not keep.any():
                continue
            src, mask = batch.src[keep].to(self.device), batch.src_padding_mask[keep].to(self.device)
            width = int((~mask).sum(dim=1).max())
            src, mask = src[:, :width], mask[:, :width]
            # The decoders' KV caches hold the weights' float32: decoding runs outside the trainer's bf16/fp16
            # autocast (which made each new key bf16, and the cache refused it), as `qkv translate` does.
            with torch.autocast(device_type=torch.device(self.device).type, enabled=False):
                if self.eval_beam == 1:
                    decoded = greedy_decode(translator, src, mask, bos_id=bos_id, eos_id=eos_id)
                else:
                    hypotheses = beam_search(
                        translator, src, mask, beam_size=self.eval_beam, bos_id=bos_id, eos_id=eos_id
                    )
                    decoded = [h[0].tokens for h in hypotheses]
            for index, tokens in zip(batch.indices[keep].tolist(), decoded, strict=True):
                outputs[index] = tokens
        order = sorted(outputs)
        return [tok.decode(outputs[i]) for i in order], [self.val_references[i] for i in order]


TranslatorConfig = TransformerConfig | RNNSearchConfig  # the configs of the translator role's families


def parallel_source(spec: str) -> str | tuple[str, str]:
    """``pairs.tsv`` stays a path; ``train.en,train.de`` becomes the pair of line-aligned files."""
    if "," in spec:
        src, _, tgt = spec.partition(",")
        return src, tgt
    return spec


def load_translation_data(config: TrainConfig) -> tuple[ParallelCorpus, ParallelCorpus, str]:
    """Training and validation pairs, and the kind of task ("dates" or "parallel")."""
    if config.data is None or config.data == "dates":
        train = date_pairs(DATES_TRAIN_PAIRS, seed=config.seed)
        return train, held_out_pairs(DATES_VAL_PAIRS, seed=config.seed, exclude=set(train.sources)), "dates"
    corpus = load_parallel(parallel_source(config.data))
    if config.val_data:
        return corpus, load_parallel(parallel_source(config.val_data)), "parallel"
    if config.val_fraction <= 0:
        raise QkvError("translation needs validation pairs: give --val-data or a --val-fraction above 0")
    train, val = split_parallel(corpus, config.val_fraction, config.seed)
    return train, val, "parallel"


def _train_tokenizers(config: TrainConfig, train: ParallelCorpus) -> tuple[Tokenizer, Tokenizer | None]:
    if config.shared_vocab:
        return train_tokenizer(config.tokenizer, train.sources + train.targets, config.vocab_size), None
    return (
        train_tokenizer(config.tokenizer, train.sources, config.vocab_size),
        train_tokenizer(config.tokenizer, train.targets, config.vocab_size),
    )


def _tokenizers_and_config(
    config: TrainConfig, resume_dir: Path | None, train: ParallelCorpus, say: Callable[[str], None]
) -> tuple[Tokenizer, Tokenizer | None, TranslatorConfig]:
    """The source and target tokenizers (None: one shared vocabulary) and the model's config: the resumed run's,
    or trained on the training pairs with the preset sized to their vocabularies; a QkvError unless it is a
    translator's."""
    if resume_dir is not None:
        source_tok = load_tokenizer(resume_dir / TOKENIZER_FILE)
        target_file = resume_dir / TARGET_TOKENIZER_FILE
        target_tok = load_tokenizer(target_file) if target_file.exists() else None
        model_config = ModelConfig.load(resume_dir / CONFIG_FILE)
    else:
        source_tok, target_tok, model_config = _train_vocabularies(config, train, say)
    if family_of(model_config).role != TRANSLATOR:
        raise QkvError(
            f"preset {config.preset!r} is {family_of(model_config).title}, not an encoder-decoder: "
            "choose a transformer-* or rnnsearch-* preset for --task translate"
        )
    return source_tok, target_tok, cast(TranslatorConfig, model_config)  # its family plays the role (checked above)


def _train_vocabularies(
    config: TrainConfig, train: ParallelCorpus, say: Callable[[str], None]
) -> tuple[Tokenizer, Tokenizer | None, ModelConfig]:
    """Tokenizers trained on the training pairs, and the preset's config sized to their vocabularies."""
    say(
        f"tokenizers: training {'a shared' if config.shared_vocab else 'a source and a target'} "
        f"{config.tokenizer} vocabulary on {len(train):,} pairs"
    )
    source_tok, target_tok = _train_tokenizers(config, train)
    model_config = make_config(
        config.preset,
        src_vocab_size=source_tok.vocab_size,
        tgt_vocab_size=(target_tok or source_tok).vocab_size,
        share_embeddings=target_tok is None,
        **dict(config.model),
    )
    return source_tok, target_tok, model_config


def prepare_translator(
    config: TrainConfig, resume_dir: Path | None, session: Session, say: Callable[[str], None]
) -> Prepared:
    """Load the pairs, train (or reload) the tokenizers, build the model (a Transformer, or RNNSearch) and
    its batches."""
    if resume_dir is None:
        check_arch(config)
    train, val, kind = load_translation_data(config)
    source_tok, target_tok, model_config = _tokenizers_and_config(config, resume_dir, train, say)
    sizes = dict(batch_size=None if config.max_tokens else config.batch_size, max_tokens=config.max_tokens)
    batches = TranslationBatches.from_corpus(
        train, source_tok, target_tok, max_len=model_config.context_length, seed=config.seed, **sizes
    )
    val_batches = TranslationBatches.from_corpus(
        val, source_tok, target_tok, max_len=model_config.context_length, **sizes
    )
    if batches.n_cropped:
        say(
            f"warning: {batches.n_cropped} training pairs were longer than the model's context_length="
            f"{model_config.context_length} tokens and were cropped (raise --context-length to keep them whole)"
        )
    check_fits(model_config, session.device, batch_size=config.batch_size)  # before allocating anything
    model = cast(Model, build_model(model_config).to(session.device))
    task = TranslationTask(
        batches,
        val_batches,
        val.targets,
        target_tok or source_tok,
        device=session.device,
        label_smoothing=config.label_smoothing,
        eval_batches=config.eval_batches,
        bleu_sentences=config.bleu_sentences,
        eval_beam=config.eval_beam,
        metric="exact_match" if kind == "dates" else "bleu",
    )
    text = "\n".join(s + "\t" + t for s, t in zip(train.sources, train.targets, strict=True))
    return Prepared(
        model,
        task,
        source_tok,
        target_tok,
        data_info={"name": train.name, "source": train.source, "sha256": fingerprint(text)},
        summary=[
            f"model: {family_of(model_config).describe(model_config)}, {model.num_parameters():,} parameters",
            f"data: {train.name}, {len(train):,} training / {len(val):,} validation pairs "
            f"({batches.n_batches:,} batches per epoch)",
        ],
    )


def train_translator(
    config: TrainConfig,
    *,
    resume: str | Path | None = None,
    quiet: bool = False,
    on_step: Callable | None = None,
):
    """Train (or, with ``resume``, continue training) a translator as ``config`` says; returns a TrainResult."""
    return run_training(config, prepare_translator, resume=resume, quiet=quiet, on_step=on_step)
