"""CPT's document packing: documents joined by a separator token and cut into full blocks."""

from __future__ import annotations

from nanocomposer.config import ConfigError

# --------------------------------------------------------------------------- CPT packing


def document_separator_id(tokenizer, separator: str | None) -> int:
    """Token id appended after every CPT document: `separator`, else <|endoftext|>, else EOS."""
    token = separator or ("<|endoftext|>" if "<|endoftext|>" in tokenizer.get_vocab() else tokenizer.eos_token)
    # Membership, not `id == unk_token_id`: SmolLM2's unknown token IS <|endoftext|> (id 0).
    token_id = tokenizer.get_vocab().get(token) if token is not None else None
    if token_id is None:
        raise ConfigError(f"document_separator {token!r} is not a token of the tokenizer")
    return token_id


def pack_documents(dataset, tokenizer, block_size: int, separator_id: int, desc: str = "packing"):
    """Tokenize `text` documents and cut the stream into blocks of exactly `block_size` tokens.

    Every block is full (no padding). `position_ids` restart at 0 where a document (or the part of one
    that continues from the previous block) starts: with no attention mask, transformers' masking_utils
    turns that into block-causal attention (`find_packed_sequence_indices`), so no token attends across
    a document boundary. The first token of each segment gets label -100: nothing before it in its
    attention window could predict it. Leftover tokens after the last full block of each map batch are
    dropped (reported by `packing_stats`).
    """

    def tokenize(batch):
        ids = tokenizer(batch["text"], add_special_tokens=False)["input_ids"]
        return {"input_ids": [doc + [separator_id] for doc in ids]}

    def group(batch):
        blocks = {"input_ids": [], "position_ids": [], "labels": []}
        ids, positions = [], []
        for doc in batch["input_ids"]:
            ids.extend(doc)
            positions.extend(range(len(doc)))
        for start in range(0, len(ids) - block_size + 1, block_size):
            block_ids = ids[start:start + block_size]
            block_pos = positions[start:start + block_size]
            offset = block_pos[0]  # > 0: the block opens inside a document, whose rest restarts at 0 here
            for i in range(block_size):
                if i > 0 and block_pos[i] == 0:
                    break
                block_pos[i] -= offset
            blocks["input_ids"].append(block_ids)
            blocks["position_ids"].append(block_pos)
            blocks["labels"].append([-100 if p == 0 else t for t, p in zip(block_ids, block_pos)])
        return blocks

    tokenized = dataset.map(tokenize, batched=True, remove_columns=dataset.column_names, desc=f"{desc}: tokenize")
    n_tokens = sum(len(ids) for ids in tokenized["input_ids"])
    packed = tokenized.map(group, batched=True, batch_size=1000, remove_columns=tokenized.column_names,
                           desc=f"{desc}: blocks of {block_size}")
    stats = {"documents": len(dataset), "tokens": n_tokens, "blocks": len(packed),
             "tokens_kept": len(packed) * block_size}
    stats["kept_fraction"] = stats["tokens_kept"] / n_tokens if n_tokens else 0.0
    return packed, stats
