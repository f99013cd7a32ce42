"""Build the ``builtin:tiny`` model that ships inside the package.

A real (if very small) Llama-architecture causal LM with a real byte-level BPE tokenizer, trained
for a few hundred steps on a small synthetic corpus so that its logits are peaked like a trained
model's: most greedy steps have a clear winner, and prompts outside the corpus still produce a few
near ties. Everything is seeded; run it with the torch pinned in the README to reproduce the
committed files:

    python scripts/make_tiny_model.py pytest_llmdeterminism/engines/tiny

The output folder is a plain transformers checkpoint (safetensors + tokenizer.json), loaded like
any local model.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

SEED = 20261129
VOCAB_SIZE = 512
CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid",
    "Japan": "Tokyo", "Egypt": "Cairo", "Peru": "Lima", "Kenya": "Nairobi",
    "Canada": "Ottawa", "Norway": "Oslo", "Greece": "Athens", "Chile": "Santiago",
}
COLOURS = {
    "sky": "blue", "grass": "green", "snow": "white", "coal": "black",
    "blood": "red", "sun": "yellow", "sea": "blue", "night": "dark",
}
NUMBERS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


def corpus(rng: random.Random) -> list[str]:
    lines = []
    for country, city in CAPITALS.items():
        lines += [
            f"The capital of {country} is {city}.",
            f"{city} is the capital of {country}.",
            f"Q: What is the capital of {country}? A: {city}.",
        ]
    for thing, colour in COLOURS.items():
        lines += [f"The colour of the {thing} is {colour}.", f"The {thing} is {colour}."]
    for i in range(len(NUMBERS) - 2):
        lines.append(f"Count: {NUMBERS[i]}, {NUMBERS[i + 1]}, {NUMBERS[i + 2]}.")
    lines += [
        "Once upon a time there was a small model that liked to count.",
        "def add(a, b): return a + b",
        "def mul(a, b): return a * b",
        "Hello, world! Hello, model!",
    ]
    # Coin-flip continuations: trained 50/50, so greedy decoding meets genuine near ties here.
    for subject, options in {
        "My favourite colour is": ("red", "blue"),
        "The weather today is": ("sunny", "rainy"),
        "The cat sat on the": ("mat", "sofa"),
    }.items():
        lines += [f"{subject} {option}." for option in options]
    rng.shuffle(lines)
    return lines


def build_tokenizer(texts: list[str], out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="<|bos|> $A", special_tokens=[("<|bos|>", 1)])
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<|pad|>", "<|bos|>", "<|eos|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>",
        padding_side="left", model_max_length=512,
    )
    fast.save_pretrained(out)


def train_model(texts: list[str], out: Path) -> None:
    import torch
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=192, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    # BOS comes from the tokenizer
    ids = [[*tokenizer(t)["input_ids"], tokenizer.eos_token_id] for t in texts]
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = random.Random(SEED)
    model.train()
    for step in range(600):
        batch = rng.sample(ids, 16)
        width = max(map(len, batch))
        input_ids = torch.full((len(batch), width), tokenizer.pad_token_id)
        mask = torch.zeros_like(input_ids)
        for row, seq in enumerate(batch):
            input_ids[row, : len(seq)] = torch.tensor(seq)
            mask[row, : len(seq)] = 1
        labels = input_ids.masked_fill(mask == 0, -100)
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimiser.step()
        optimiser.zero_grad()
        if step % 100 == 0:
            print(f"step {step} loss {loss.item():.3f}")
    model.eval()
    # Sampling defaults on purpose: the plugin must override a checkpoint's own sampling config.
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id, do_sample=True, temperature=0.7, top_p=0.9, top_k=20,
    )
    model.save_pretrained(out, safe_serialization=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    texts = corpus(random.Random(SEED))
    build_tokenizer(texts, args.out)
    train_model(texts, args.out)
    for path in sorted(args.out.iterdir()):
        print(f"{path.name}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
