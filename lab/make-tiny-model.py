#!/usr/bin/env python3
"""Generate the lab's tiny Qwen2 model locally, without any hub access.

Usage (with the node venv's python, which has torch, transformers, tokenizers):

    PYTHONDONTWRITEBYTECODE=1 $NODE_VENV/bin/python lab/make-tiny-model.py [TARGET_DIR]

TARGET_DIR defaults to /var/lib/multinode-vllm-lab/cache/models/tiny-qwen2.

The model is a Qwen2ForCausalLM with random bf16 weights (hidden 256, 4 heads,
2 KV heads, so head_dim 64: vLLM's CPU attention rejects head_dim 16; 2 layers,
vocab 512, intermediate 512, max_position_embeddings 2048), saved by
transformers as safetensors, plus a byte-level BPE tokenizer trained with
`tokenizers` on a built-in synthetic corpus (tokenizer.json,
tokenizer_config.json with bos/eos/pad tokens and a ChatML-style chat
template). Its output is gibberish by design: the lab tests plumbing, not
quality.

Deterministic: fixed seeds and a fixed corpus give byte-identical weights and
tokenizer for a given torch/transformers/tokenizers version. Idempotent: the
model is built in a temporary sibling directory and renamed into place with a
completion marker last; an existing complete model is left alone.
"""

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

# No hub, no telemetry, no bytecode in the venv.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
sys.dont_write_bytecode = True

DEFAULT_TARGET = "/var/lib/multinode-vllm-lab/cache/models/tiny-qwen2"
MARKER = ".tiny-model-complete"
MARKER_VERSION = "tiny-qwen2 v1"
SEED = 1234
REQUIRED_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)

BOS = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [BOS, IM_START, IM_END]  # ids 0, 1, 2
# eos is <|im_end|> (end of a chat turn, as in Qwen2 chat models); pad and bos
# are <|endoftext|>.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

MODEL_CONFIG = dict(
    vocab_size=512,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    max_window_layers=2,
    rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    tie_word_embeddings=True,
    use_sliding_window=False,
    hidden_act="silu",
    initializer_range=0.02,
    bos_token_id=0,
    eos_token_id=2,
    pad_token_id=0,
)


def corpus():
    """A fixed, varied English-ish corpus so that BPE learns ~250 merges."""
    subjects = [
        "the cluster", "a node", "the head node", "the worker", "vLLM", "Ray",
        "the scheduler", "a tensor", "the model", "the engine", "the fabric link",
        "the operator", "an ansible role", "the playbook", "the inventory",
    ]
    verbs = [
        "starts", "serves", "connects to", "waits for", "reports", "binds",
        "routes", "checks", "loads", "streams", "answers", "restarts",
    ]
    objects = [
        "the completion request", "port 8000", "the management network",
        "the GCS address", "two ranks", "a tiny model", "the health endpoint",
        "the token file", "each interface", "the placement group",
        "the rendezvous", "a chat message", "the key value cache",
    ]
    extras = [
        "quickly.", "after a restart.", "over TCP.", "with gloo.", "on CPU.",
        "without errors.", "every few seconds.", "in the lab.", "as expected.",
        "1 2 3 4 5 6 7 8 9 10.", "Hello, world!", "What is the answer? 42.",
    ]
    lines = []
    for i, s in enumerate(subjects):
        for j, v in enumerate(verbs):
            o = objects[(i * 7 + j * 3) % len(objects)]
            e = extras[(i + j * 5) % len(extras)]
            lines.append(f"{s.capitalize()} {v} {o} {e}")
    lines += [f"{IM_START}user\nHello{IM_END}\n{IM_START}assistant\nHi there{IM_END}"]
    return lines


def is_complete(target: Path) -> bool:
    marker = target / MARKER
    return (
        marker.is_file()
        and marker.read_text().strip() == MARKER_VERSION
        and all((target / f).is_file() for f in REQUIRED_FILES)
    )


def build(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(SEED)

    # --- tokenizer: byte-level BPE, vocab <= 512 ---------------------------
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=MODEL_CONFIG["vocab_size"],
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))
    assert tok.get_vocab_size() <= MODEL_CONFIG["vocab_size"], tok.get_vocab_size()

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=IM_END,
        pad_token=BOS,
        model_max_length=MODEL_CONFIG["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.save_pretrained(str(out))
    # Keep the chat template inside tokenizer_config.json as well (newer
    # transformers write it to chat_template.jinja), so older loaders see it.
    cfg_path = out / "tokenizer_config.json"
    tok_cfg = json.loads(cfg_path.read_text())
    tok_cfg["chat_template"] = CHAT_TEMPLATE
    tok_cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(tok_cfg, indent=2, sort_keys=True) + "\n")

    # --- model: random bf16 Qwen2 ------------------------------------------
    config = Qwen2Config(**MODEL_CONFIG)
    config.architectures = ["Qwen2ForCausalLM"]
    model = Qwen2ForCausalLM(config)
    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.generation_config.bos_token_id = MODEL_CONFIG["bos_token_id"]
    model.generation_config.eos_token_id = MODEL_CONFIG["eos_token_id"]
    model.generation_config.pad_token_id = MODEL_CONFIG["pad_token_id"]
    model.save_pretrained(str(out), safe_serialization=True)

    # --- self-check ----------------------------------------------------------
    from transformers import AutoConfig, AutoTokenizer

    t2 = AutoTokenizer.from_pretrained(str(out))
    ids = t2.apply_chat_template(
        [{"role": "user", "content": "Hello"}], add_generation_prompt=True, tokenize=True
    )
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    assert ids and max(ids) < MODEL_CONFIG["vocab_size"], ids
    assert t2.eos_token == IM_END and t2.bos_token == BOS, (t2.eos_token, t2.bos_token)
    c2 = AutoConfig.from_pretrained(str(out))
    assert c2.hidden_size // c2.num_attention_heads == 64
    for f in REQUIRED_FILES:
        assert (out / f).is_file(), f


def main(argv) -> int:
    target = Path(argv[1] if len(argv) > 1 else DEFAULT_TARGET).absolute()
    if is_complete(target):
        print(f"[make-tiny-model] up to date: {target}")
        return 0
    if target.exists():
        if target.is_dir() and not any(target.iterdir()):
            target.rmdir()
        else:
            print(
                f"[make-tiny-model] ERROR: {target} exists but is not a complete tiny model "
                f"(no {MARKER}); remove it first",
                file=sys.stderr,
            )
            return 1
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=str(target.parent)))
    try:
        build(tmp)
        (tmp / MARKER).write_text(MARKER_VERSION + "\n")
        # Readable by every lab user (save_pretrained leaves safetensors 0600).
        for p in tmp.iterdir():
            os.chmod(p, 0o644)
        os.chmod(tmp, 0o755)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    size = sum(p.stat().st_size for p in target.iterdir() if p.is_file())
    print(f"[make-tiny-model] wrote {target} ({size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
