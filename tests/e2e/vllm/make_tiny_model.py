"""Build a tiny, deterministic, randomly initialised Llama model for end-to-end tests against real vLLM.

Usage::

    HF_HUB_OFFLINE=1 python make_tiny_model.py OUT_DIR

The output directory holds a Hugging Face model (``config.json``, ``model.safetensors``, ...) plus a
byte-level BPE tokenizer trained offline on a small inline corpus, with a minimal chat template. Nothing is
downloaded. The same inputs give the same bytes on every run: the tokenizer training is deterministic and the
weights come from a fixed seed.

Shape (what vLLM's CPU backend needs, and small enough to load in milliseconds): hidden size 128,
2 layers, 4 attention heads (head dim 32, a multiple of 32 as the CPU attention backend requires),
2 key/value heads, bf16 weights, vocabulary of about 440 tokens. That gives 512 bytes of KV cache per token.

It runs inside the vLLM venv (it needs ``torch``, ``tokenizers`` and ``transformers``), not the dev venv.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SEED = 0
BPE_VOCAB_TARGET = 512
SPECIAL_TOKENS: tuple[str, ...] = ("<unk>", "<s>", "</s>", "<pad>")
SPECIAL_TOKEN_ROLES: dict[str, str] = dict(
    zip(("unk_token", "bos_token", "eos_token", "pad_token"), SPECIAL_TOKENS, strict=True)
)

# The load scenario in ``load.py`` builds its prompts from these sentences, so they tokenize compactly.
CORPUS_SENTENCES: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog. " * 4,
    "vLLM is a high-throughput and memory-efficient inference engine. ",
    "Prometheus scrapes metrics such as kv cache usage and running requests. ",
    "You are a helpful assistant. Answer the question concisely. ",
    "0 1 2 3 4 5 6 7 8 9 hello world tokens prefix cache hit query ",
)
CORPUS_REPEATS = 20

CHAT_TEMPLATE = (
    "{% for message in messages %}<s>{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on the inline corpus (byte-level: it never emits ``<unk>``)."""
    core = Tokenizer(models.BPE(unk_token=None))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_TARGET,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(list(CORPUS_SENTENCES) * CORPUS_REPEATS, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        **SPECIAL_TOKEN_ROLES,
        model_max_length=2048,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    """Create the random-weight bf16 Llama whose vocabulary matches ``tokenizer``."""
    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).to(torch.bfloat16)


def make_tiny_model(out_dir: Path) -> tuple[int, int]:
    """Write tokenizer and model into ``out_dir``; return ``(vocab_size, parameter_count)``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(out_dir)
    model = build_model(tokenizer)
    model.save_pretrained(out_dir, safe_serialization=True)
    parameters = sum(p.numel() for p in model.parameters())
    return len(tokenizer), parameters


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out_dir", type=Path, help="directory to write the model into (created if missing)")
    args = parser.parse_args(argv)
    vocab_size, parameters = make_tiny_model(args.out_dir)
    print(f"tiny model in {args.out_dir}: vocab={vocab_size} params={parameters}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
