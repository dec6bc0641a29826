"""Llama with smeared keys: each attention key also carries the previous token's key, so a tiny model can copy.

Every rung of the task ladder asks the agent to write a name it has only seen in its context, which takes an
induction circuit: a "previous token" head writes token j-1 into position j, and a second head matches the
current token against it and copies what followed. In a standard transformer that circuit forms only after a
long plateau (docs/copying.md: a 5.3 M-parameter Llama showed 0.5-3% copy accuracy after 7.7 M CPT tokens).
Smeared keys (Olsson et al. 2022, "In-context Learning and Induction Heads", section on the smeared-key
architecture) build the previous-token half into the attention itself: per key head a learned mix

    key'_j = sigmoid(a) * key_j + (1 - sigmoid(a)) * key_{j-1}          (before rotary embeddings)

so one layer can match "the token before this position" directly. Measured here (docs/copying.md), 2 layers
on repeated random tokens: 59% of second-half tokens copied after 500 steps with smeared keys, 0% after 1,000
steps without.

Implementation: rotary embeddings compose (R_j = R_1 R_{j-1}), so the mix can be taken after rotation from the
keys attention already has: key'_j = w R_j k_j + (1 - w) R_1 (R_{j-1} k_{j-1}). The KV cache therefore stores
the usual rotated keys (any transformers cache, our batched decode cache and its prefix cache work unchanged).
A forward over as many queries as keys (training, a first prefill) mixes the keys, then runs the configured
attention. A forward of few queries over many cached keys (decoding) mixes the scores instead,
w (q . k_j) + (1 - w) ((R_-1 q) . k_{j-1}): one matmul of the query and its back-rotation against the cache,
since mixing the cached keys again at every decoded token took several passes over all of them (measured:
batched greedy decoding 5.8x slower than a plain Llama of the same shape that way, 1.15x this way). Longer
chunks over a cache (a prefix-cached prefill) mix the keys: `SCORE_SMEAR_MAX_QUERIES`. A key whose
predecessor its query cannot see (left padding, a packed document's first token, the very first position)
mixes with zero instead, so a row scores the same padded or alone.

Loaded like any checkpoint (`AutoModelForCausalLM.from_pretrained(dir)`) once this module is imported (it
registers the config and model with transformers' Auto classes; every project module that loads a model or a
tokenizer imports it).
vLLM has no such architecture: its backend refuses this model type with a one-line error; serve it with the
transformers backend. Only the default rotary embedding (no scaling) is supported: other rope types scale
cos/sin, and a one-position rotation would then not be a pure rotation.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.models.llama import modeling_llama
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding, rotate_half

MODEL_TYPE = "smeared_llama"
# Up to this many queries over more cached keys, the mix is taken in score space (per query and key) rather
# than over the keys (per key and head dimension): cheaper while queries are fewer than ~head_dim / 4
# (measured, the tiny preset's 4 layers x 256 wide, one row, 1,800 cached keys: decoding a token 7-11 ms in
# score space vs 19 ms over the keys; 300 new tokens 232 ms in score space vs 109-116 ms over the keys).
SCORE_SMEAR_MAX_QUERIES = 16


class SmearedKeyLlamaConfig(LlamaConfig):
    """LlamaConfig plus `key_smear_init`: the initial logit of every head's weight on its own key (0: half)."""

    model_type = MODEL_TYPE

    def __init__(self, key_smear_init: float = 0.0, **kwargs):
        self.key_smear_init = key_smear_init
        super().__init__(**kwargs)


def previous_key_visible(attention_mask, batch: int, q_len: int, k_len: int, device) -> torch.Tensor:
    """(batch, 1, k_len, 1) float: 1 where key j-1 is visible to the query that sees key j, else 0.

    Key j (j >= k_len - q_len) belongs to query j - (k_len - q_len); an older cached key to the first query.
    The mask may be None (causal, no padding), boolean (True: attend) or additive float (0: attend).
    """
    visible = torch.ones((batch, k_len), device=device)
    visible[:, 0] = 0.0
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4 and k_len > 1:
        mask = attention_mask[:, 0, :, :k_len]
        allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
        keys = torch.arange(1, k_len, device=device)
        queries = (keys - (k_len - q_len)).clamp(min=0, max=allowed.shape[1] - 1)
        visible[:, 1:] = allowed[:, queries, keys - 1].to(visible.dtype).expand(batch, -1)
    return visible[:, None, :, None]


class SmearedKeyAttention(LlamaAttention):
    """LlamaAttention whose keys are mixed with their predecessors' (module docstring)."""

    def __init__(self, config: SmearedKeyLlamaConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        rope_type = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
        if rope_type != "default":
            raise ValueError(f"{MODEL_TYPE}: rope_type {rope_type!r} is not supported (only 'default')")
        self.key_smear_logit = nn.Parameter(torch.full((config.num_key_value_heads,), float(config.key_smear_init)))
        self.rotary_one = LlamaRotaryEmbedding(config)  # rotation by one position (non-persistent buffers)

    def smear(self, keys: torch.Tensor, attention_mask, q_len: int) -> torch.Tensor:
        """The mixed keys for attention; `keys` are the rotated keys (cached ones first), `q_len` the new ones."""
        batch, _, k_len, _ = keys.shape
        one = torch.ones((1, 1), dtype=torch.long, device=keys.device)
        cos, sin = self.rotary_one(keys, one)  # (1, 1, head_dim)
        previous = torch.nn.functional.pad(keys, (0, 0, 1, 0))[:, :, :-1]
        previous = previous * cos[:, None] + rotate_half(previous) * sin[:, None]
        previous = previous * previous_key_visible(attention_mask, batch, q_len, k_len, keys.device).to(keys.dtype)
        own = torch.sigmoid(self.key_smear_logit).to(keys.dtype)[None, :, None, None]
        return own * keys + (1 - own) * previous

    def attend_smeared_scores(self, query, keys, values, attention_mask):
        """Attention with smeared keys, smeared in score space: q . (w k_j + (1 - w) R_1 k_{j-1}) =
        w (q . k_j) + (1 - w) ((R_-1 q) . k_{j-1}), so the query and its one-position back-rotation meet the
        cached keys in one matmul and nothing of the size of the cache is built per step (smearing the cached
        keys themselves costs several passes over all of them at every decoded token). Same result as
        `smear` + attention; used when few queries meet many cached keys (SCORE_SMEAR_MAX_QUERIES: decoding)."""
        batch, _, q_len, _ = query.shape
        k_len = keys.shape[-2]
        keys = modeling_llama.repeat_kv(keys, self.num_key_value_groups)
        values = modeling_llama.repeat_kv(values, self.num_key_value_groups)
        one = torch.ones((1, 1), dtype=torch.long, device=query.device)
        cos, sin = self.rotary_one(query, one)
        back = query * cos[:, None] - rotate_half(query) * sin[:, None]  # R_1 transposed: back by one position
        scores = torch.matmul(torch.cat([query, back], dim=2), keys.transpose(2, 3))
        previous = torch.nn.functional.pad(scores[:, :, q_len:], (1, 0))[..., :-1]  # key j: (R_-1 q) . k_{j-1}
        visible = previous_key_visible(attention_mask, batch, q_len, k_len, query.device).to(query.dtype)
        own = torch.sigmoid(self.key_smear_logit).to(query.dtype).repeat_interleave(self.num_key_value_groups)
        own = own[None, :, None, None]
        weights = (own * scores[:, :, :q_len] + (1 - own) * visible.view(batch, 1, 1, k_len) * previous) * self.scaling
        if attention_mask is None:  # causal: query i is at position k_len - q_len + i
            rows = torch.arange(q_len, device=query.device)[:, None] + (k_len - q_len)
            attention_mask = torch.arange(k_len, device=query.device)[None, :] <= rows
        else:
            attention_mask = attention_mask[..., :k_len]
        if attention_mask.dtype == torch.bool:
            weights = weights.masked_fill(~attention_mask, torch.finfo(weights.dtype).min)
        else:
            weights = weights + attention_mask
        weights = nn.functional.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
        weights = nn.functional.dropout(weights, p=self.attention_dropout if self.training else 0.0,
                                        training=self.training)
        return torch.matmul(weights, values).transpose(1, 2).contiguous(), weights

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, cache=None, **kwargs):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        query_states, key_states = modeling_llama.apply_rotary_pos_emb(query_states, key_states, cos, sin)
        if cache is not None:
            key_states, value_states = cache.update(key_states, value_states, self.layer_idx, kwargs=kwargs)
        q_len, k_len = query_states.shape[-2], key_states.shape[-2]
        if q_len < k_len and q_len <= SCORE_SMEAR_MAX_QUERIES:  # decoding over cached keys: smear the scores
            attn_output, attn_weights = self.attend_smeared_scores(query_states, key_states, value_states,
                                                                   attention_mask)
            return self.o_proj(attn_output.reshape(*input_shape, -1).contiguous()), attn_weights
        key_states = self.smear(key_states, attention_mask, query_states.shape[-2])
        attention = modeling_llama.ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, modeling_llama.eager_attention_forward)
        attn_output, attn_weights = attention(
            self, query_states, key_states, value_states, attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout, scaling=self.scaling, **kwargs)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output), attn_weights


class SmearedKeyLlamaForCausalLM(LlamaForCausalLM):
    config_class = SmearedKeyLlamaConfig

    def __init__(self, config: SmearedKeyLlamaConfig):
        super().__init__(config)
        for index, layer in enumerate(self.model.layers):
            layer.self_attn = SmearedKeyAttention(config, index)
            for module in layer.self_attn.modules():  # the Llama initialisation for the replaced projections
                self._init_weights(module)

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, SmearedKeyAttention):
            with torch.no_grad():
                module.key_smear_logit.fill_(float(self.config.key_smear_init))


AutoConfig.register(MODEL_TYPE, SmearedKeyLlamaConfig, exist_ok=True)
AutoModelForCausalLM.register(SmearedKeyLlamaConfig, SmearedKeyLlamaForCausalLM, exist_ok=True)
