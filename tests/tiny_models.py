"""Tiny real configs shared by the measure, simulate and CLI tests, with hand-derived counts."""

GPT2 = {
    "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 1000, "n_positions": 128,
    "n_embd": 64, "n_layer": 2, "n_head": 4, "bos_token_id": 0, "eos_token_id": 0,
}  # fmt: skip
LLAMA = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 1000, "hidden_size": 64,
    "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 256, "bos_token_id": 0, "eos_token_id": 0,
}  # fmt: skip

# Parameter counts, hand-derived. Llama: embed 1000*64 + per layer (q 64*64 + k 64*32 + v 64*32 +
# o 64*64 + gate/up/down 3*64*176 + 2 norms 2*64) + final norm 64 + untied head 1000*64.
LLAMA_P = 1000 * 64 + 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 176 + 2 * 64) + 64 + 1000 * 64
LLAMA_TENSORS = 1 + 2 * 9 + 1 + 1  # parameter tensors: embed, 9 per layer, norm, head
LLAMA_BUFFER_BYTES = 2 * 8 * 4  # rotary inv_freq and original_inv_freq: head_dim/2 = 8 fp32 values each
# GPT-2: wte 1000*64 + wpe 128*64 + per layer (ln 2*64, c_attn 64*192+192, c_proj 64*64+64, ln 2*64,
# c_fc 64*256+256, c_proj 256*64+64) + ln_f 2*64; the head is tied to wte.
GPT2_P = (
    1000 * 64 + 128 * 64 + 2 * (4 * 64 + 64 * 192 + 192 + 64 * 64 + 64 + 64 * 256 + 256 + 256 * 64 + 64) + 128
)
GPT2_TENSORS = 2 + 2 * 12 + 2  # wte, wpe, 12 per layer, ln_f weight and bias
