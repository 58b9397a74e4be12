"""Architecture recipes (``model.recipe``): published families as settings of the registered components.

Each recipe fixes a family's component choices and ratios, each line with the paper section or the
official ``config.json`` that gives it; the grid's ``model.d_model``, ``n_layers``, ``n_heads`` and
``context`` set the size. Head layouts are ratios of ``n_heads`` (GQA's n_kv_heads / n_heads), a
sliding window a fraction of the context, an FFN's hidden size a ratio of ``d_model`` (the published
intermediate size / hidden size, its rounding included). Where a family has something no registered
component expresses, the recipe says so in ``gaps`` instead of approximating it silently
(docs/recipes.md lists them all).

Not set by any recipe: the RoPE pair layout (interleaved or half-split pairs are a fixed permutation
of the learned q/k projections, the same function), the initialisation and every training setting.
"""

from __future__ import annotations

from abl import Scaled, Setting, hookimpl, of_context, of_width, per_head

# ---------------------------------------------------------------- sources
LLAMA1 = "Touvron et al. 2023, LLaMA, arXiv:2302.13971 sec. 2.2"
LLAMA2 = "Touvron et al. 2023, Llama 2, arXiv:2307.09288 sec. 2.2"
LLAMA2_CFG = "config.json of meta-llama/Llama-2-7b-hf"
GPT2 = "Radford et al. 2019, Language Models are Unsupervised Multitask Learners, sec. 2.3"
GPT1 = "Radford et al. 2018, Improving Language Understanding by Generative Pre-Training, sec. 4.1"
GPT2_CFG = "config.json of openai-community/gpt2"
GEMMA2 = "Gemma Team 2024, Gemma 2, arXiv:2408.00118 sec. 2"
GEMMA2_T1 = "Gemma Team 2024, Gemma 2, arXiv:2408.00118 Table 1"
GEMMA2_CFG = "config.json of google/gemma-2-9b"
OLMO2 = "OLMo et al. 2024, 2 OLMo 2 Furious, arXiv:2501.00656 (architecture: reordered norm, eqs. 1-2; QK-norm)"
OLMO2_CFG = "config.json of allenai/OLMo-2-1124-7B"
MISTRAL = "Jiang et al. 2023, Mistral 7B, arXiv:2310.06825 sec. 2 and Table 1"
MISTRAL_CFG = "config.json of mistralai/Mistral-7B-v0.1"
QWEN3 = "Qwen Team 2025, Qwen3 Technical Report, arXiv:2505.09388 sec. 2 and Table 1"
QWEN3_CFG = "config.json of Qwen/Qwen3-8B"
DSV3 = "DeepSeek-AI 2024, DeepSeek-V3 Technical Report, arXiv:2412.19437 sec. 2.1"
DSV3_HP = "DeepSeek-AI 2024, DeepSeek-V3 Technical Report, arXiv:2412.19437 sec. 4.2 (model hyper-parameters)"
DSV3_CFG = "config.json of deepseek-ai/DeepSeek-V3"
JAMBA = "Lieber et al. 2024, Jamba, arXiv:2403.19887 sec. 2"
JAMBA_CFGSEC = "Lieber et al. 2024, Jamba, arXiv:2403.19887 sec. 3.1 (l=8, a:m=1:7, e=2, n=16, K=2)"
JAMBA_POS = "Lieber et al. 2024, Jamba, arXiv:2403.19887 sec. 6 (explicit positional information is not needed)"
JAMBA_CFG = "config.json of ai21labs/Jamba-v0.1"

MHA = per_head(1.0, "n_heads (MHA)")


def _pre_rmsnorm(eps: float, eps_source: str, source: str) -> list[Setting]:
    return [
        Setting("model.block", "pre", source),
        Setting("model.norm", "rmsnorm", source),
        Setting("norm.rmsnorm.eps", eps, eps_source),
        Setting("norm.rmsnorm.bias", False, source),
    ]


def _swiglu(ratio: float, source: str) -> list[Setting]:
    return [
        Setting("model.ffn", "swiglu", source),
        Setting("ffn.swiglu.ratio", ratio, source),
        Setting("ffn.swiglu.bias", False, source),
    ]


def _rope(theta: float, source: str) -> list[Setting]:
    return [Setting("model.position", "rope", source), Setting("position.rope.theta", theta, source)]


def _attention(mixer: str, kv: Scaled, source: str, *, qk_norm: bool = False, bias: bool = False,
               softcap: float = 0.0, softcap_source: str = "") -> list[Setting]:
    return [
        Setting(f"mixer.{mixer}.n_kv_heads", kv, source),
        Setting(f"mixer.{mixer}.bias", bias, source),
        Setting(f"mixer.{mixer}.qk_norm", qk_norm, source),
        Setting(f"mixer.{mixer}.softcap", softcap, softcap_source or f"{source} (no attention soft-capping)"),
    ]


def llama() -> list[Setting]:
    return [
        *_pre_rmsnorm(1e-5, f"{LLAMA2_CFG}: rms_norm_eps 1e-05", f"{LLAMA1} (pre-normalization, RMSNorm)"),
        *_rope(10000.0, f"{LLAMA1} (rotary embeddings); {LLAMA2_CFG}: rope_theta 10000.0"),
        Setting("model.mixer", "mha", f"{LLAMA2} (7B and 13B: multi-head; GQA only for 34B/70B)"),
        *_attention("mha", MHA, f"{LLAMA2_CFG}: num_key_value_heads 32 = num_attention_heads 32, "
                    "attention_bias false"),
        *_swiglu(11008 / 4096, f"{LLAMA1} (SwiGLU, 2/3 4d); {LLAMA2_CFG}: intermediate_size 11008 / "
                 "hidden_size 4096"),
        Setting("model.tie_embeddings", False, f"{LLAMA2_CFG}: tie_word_embeddings false"),
    ]


def gpt2() -> list[Setting]:
    return [
        Setting("model.block", "pre", f"{GPT2} (layer norm moved to the input of each sub-block, "
                "one more after the final block)"),
        Setting("model.norm", "layernorm", GPT2),
        Setting("norm.layernorm.eps", 1e-5, f"{GPT2_CFG}: layer_norm_epsilon 1e-05"),
        Setting("norm.layernorm.gain", True, GPT2_CFG),
        Setting("norm.layernorm.bias", True, GPT2_CFG),
        Setting("model.position", "learned", f"{GPT1} (learned position embeddings); {GPT2_CFG}: wpe"),
        Setting("model.mixer", "mha", GPT2_CFG),
        *_attention("mha", MHA, f"{GPT2_CFG}: n_head heads, c_attn/c_proj with biases", bias=True),
        Setting("model.ffn", "gelu", f"{GPT1} (GELU); {GPT2_CFG}: activation_function gelu_new"),
        Setting("ffn.gelu.ratio", 4.0, f"{GPT2_CFG}: n_inner null = 4 * n_embd"),
        Setting("ffn.gelu.bias", True, f"{GPT2_CFG}: c_fc/c_proj with biases"),
        Setting("model.tie_embeddings", True, f"{GPT2_CFG}: GPT2LMHeadModel ties lm_head to wte"),
        Setting("model.dropout", 0.1, f"{GPT2_CFG}: resid_pdrop 0.1"),
    ]


def gemma2() -> list[Setting]:
    half = per_head(0.5, "n_heads / 2")
    kv_src = f"{GEMMA2} (GQA, num_groups = 2); {GEMMA2_T1}: 8 heads / 4 KV (2B), 16 / 8 (9B)"
    cap_src = f"{GEMMA2} (logit soft-capping, 50.0 in attention); {GEMMA2_CFG}: attn_logit_softcapping 50.0"
    return [
        Setting("model.block", "sandwich", f"{GEMMA2} (post-norm and pre-norm with RMSNorm)"),
        Setting("model.norm", "rmsnorm", GEMMA2),
        Setting("norm.rmsnorm.eps", 1e-6, f"{GEMMA2_CFG}: rms_norm_eps 1e-06"),
        Setting("norm.rmsnorm.bias", False, GEMMA2_CFG),
        *_rope(10000.0, f"{GEMMA2} (RoPE); {GEMMA2_CFG}: rope_theta 10000.0"),
        Setting("model.mixer", "mha", f"{GEMMA2} (global layers)"),
        Setting("model.layer_pattern", "sliding_window,mha",
                f"{GEMMA2} (local sliding window and global attention in every other layer); modeling_gemma2.py: "
                "even layers slide"),
        Setting("mixer.sliding_window.window", of_context(0.5, "context / 2"),
                f"{GEMMA2} (window 4096 tokens, global span 8192)"),
        *_attention("sliding_window", half, kv_src, softcap=50.0, softcap_source=cap_src),
        *_attention("mha", half, kv_src, softcap=50.0, softcap_source=cap_src),
        Setting("model.ffn", "geglu", f"{GEMMA2_T1} (non-linearity GeGLU)"),
        Setting("ffn.geglu.ratio", 4.0, f"{GEMMA2_CFG}: intermediate_size 14336 / hidden_size 3584 "
                "(2B: 9216 / 2304)"),
        Setting("ffn.geglu.bias", False, GEMMA2_CFG),
        Setting("model.tie_embeddings", True, f"{GEMMA2_T1} (tied embeddings: yes)"),
        Setting("model.embed_scale", "sqrt_d_model", f"{GEMMA2_CFG} with modeling_gemma2.py: the input "
                "embeddings are multiplied by hidden_size ** 0.5 (normalizer)"),
        Setting("model.logit_softcap", 30.0, f"{GEMMA2} (logit soft-capping, 30.0 for the final layer); "
                f"{GEMMA2_CFG}: final_logit_softcapping 30.0"),
    ]


def olmo2() -> list[Setting]:
    return [
        Setting("model.block", "post_branch", f"{OLMO2}: h = x + RMSNorm(Attention(x)), out = h + RMSNorm(MLP(h))"),
        Setting("model.norm", "rmsnorm", OLMO2),
        Setting("norm.rmsnorm.eps", 1e-6, f"{OLMO2_CFG}: rms_norm_eps 1e-06"),
        Setting("norm.rmsnorm.bias", False, f"{OLMO2} (no biases)"),
        *_rope(500000.0, f"{OLMO2} (RoPE); {OLMO2_CFG}: rope_theta 500000"),
        Setting("model.mixer", "mha", OLMO2_CFG),
        *_attention("mha", MHA, f"{OLMO2} (QK-norm, no biases); {OLMO2_CFG}: num_key_value_heads 32 = "
                    "num_attention_heads 32", qk_norm=True),
        *_swiglu(11008 / 4096, f"{OLMO2} (SwiGLU); {OLMO2_CFG}: intermediate_size 11008 / hidden_size 4096"),
        Setting("model.tie_embeddings", False, f"{OLMO2_CFG}: tie_word_embeddings false"),
        Setting("model.z_loss", 1e-5, f"{OLMO2} (training stability: z-loss regularisation, coefficient 1e-5, "
                "PaLM's output z-loss)"),
    ]


def mistral() -> list[Setting]:
    return [
        *_pre_rmsnorm(1e-5, f"{MISTRAL_CFG}: rms_norm_eps 1e-05", f"{MISTRAL} (Llama's architecture); "
                      f"{MISTRAL_CFG}"),
        *_rope(10000.0, f"{MISTRAL_CFG}: rope_theta 10000.0"),
        Setting("model.mixer", "sliding_window", f"{MISTRAL} (sliding window attention)"),
        Setting("mixer.sliding_window.window", of_context(0.5, "context / 2"),
                f"{MISTRAL}: window_size 4096, context_len 8192"),
        *_attention("sliding_window", per_head(0.25, "n_heads / 4"), f"{MISTRAL}: n_heads 32, n_kv_heads 8 (GQA)"),
        *_swiglu(14336 / 4096, f"{MISTRAL}: hidden_dim 14336 / dim 4096; {MISTRAL_CFG}: hidden_act silu"),
        Setting("model.tie_embeddings", False, f"{MISTRAL_CFG}: tie_word_embeddings false"),
    ]


def qwen3() -> list[Setting]:
    return [
        *_pre_rmsnorm(1e-6, f"{QWEN3_CFG}: rms_norm_eps 1e-06", f"{QWEN3} (RMSNorm with pre-normalization)"),
        *_rope(1000000.0, f"{QWEN3} (RoPE); {QWEN3_CFG}: rope_theta 1000000"),
        Setting("model.mixer", "mha", f"{QWEN3} (GQA)"),
        *_attention("mha", per_head(0.25, "n_heads / 4"),
                    f"{QWEN3}: Qwen3-8B 32 query / 8 KV heads; QKV-bias removed, QK-Norm added "
                    "(per head: modeling_qwen3.py q_norm over head_dim)", qk_norm=True),
        *_swiglu(12288 / 4096, f"{QWEN3} (SwiGLU); {QWEN3_CFG}: intermediate_size 12288 / hidden_size 4096"),
        Setting("model.tie_embeddings", False, f"{QWEN3}: Qwen3-8B tie embedding no"),
    ]


def deepseek_v3_small() -> list[Setting]:
    moe = f"{DSV3} (DeepSeekMoE: shared and fine-grained routed experts)"
    return [
        *_pre_rmsnorm(1e-6, f"{DSV3_CFG}: rms_norm_eps 1e-06", f"{DSV3} (RMSNorm); {DSV3_CFG}"),
        *_rope(10000.0, f"{DSV3} (decoupled RoPE); {DSV3_CFG}: rope_theta 10000"),
        Setting("model.mixer", "mla", f"{DSV3} (Multi-head Latent Attention, sec. 2.1.1)"),
        Setting("mixer.mla.kv_rank", Scaled(lambda m: 4 * m.head_dim, "4 x head_dim"),
                f"{DSV3_HP}: d_c 512 = 4 x d_h 128"),
        Setting("mixer.mla.q_rank", of_width(1536 / 7168, "d_model x 1536/7168"),
                f"{DSV3_HP}: d_c' 1536, hidden 7168"),
        Setting("mixer.mla.rope_dim", Scaled(lambda m: max(2, 2 * (m.head_dim // 4)), "head_dim / 2 (even)"),
                f"{DSV3_HP}: d_h^R 64 = d_h 128 / 2"),
        Setting("mixer.mla.latent_norm", True, f"{DSV3} (sec. 2.1.1); modeling_deepseek.py: q_a_layernorm, "
                "kv_a_layernorm"),
        Setting("model.ffn", "moe", f"{DSV3_HP} (all FFNs but the first three are MoE)"),
        Setting("ffn.moe.routing", "token_choice", f"{moe}: top-K affinities per token"),
        Setting("ffn.moe.n_experts", 16, f"small: {DSV3_HP} uses 256 routed experts; scaled down to 16"),
        Setting("ffn.moe.top_k", 2, f"small: {DSV3_HP} activates 8 of 256; scaled down to 2 of 16"),
        Setting("ffn.moe.n_shared_experts", 1, f"{DSV3_HP}: 1 shared expert"),
        Setting("ffn.moe.expert", "swiglu", f"{DSV3_CFG}: hidden_act silu (gated experts)"),
        Setting("ffn.moe.expert_ratio", 2048 / 7168, f"{DSV3_HP}: expert hidden 2048 / hidden 7168"),
        Setting("ffn.moe.bias", False, DSV3_CFG),
        Setting("ffn.moe.router_bias", False, f"{DSV3} (sec. 2.1.2: no router bias in the affinities; the "
                "balancing bias b_i only picks the experts, see gaps)"),
        Setting("ffn.moe.aux_loss_coef", 0.0001, f"{DSV3_HP}: balance-loss factor alpha = 0.0001"),
        Setting("ffn.moe.router_z_loss_coef", 0.0, f"{DSV3} (no router z-loss)"),
        Setting("ffn.moe.capacity_factor", 0.0, f"{DSV3} sec. 2.1.2 (no token dropping)"),
        Setting("model.tie_embeddings", False, f"{DSV3_CFG}: tie_word_embeddings false"),
    ]


JAMBA_PATTERN = "mamba,mamba,mamba,mamba,mha,mamba,mamba,mamba"


def jamba() -> list[Setting]:
    return [
        *_pre_rmsnorm(1e-6, f"{JAMBA_CFG}: rms_norm_eps 1e-06", f"{JAMBA} (RMSNorm before each layer)"),
        Setting("model.position", "nope", JAMBA_POS),
        Setting("model.mixer", "mamba", f"{JAMBA} (Mamba layers)"),
        Setting("model.layer_pattern", JAMBA_PATTERN,
                f"{JAMBA_CFGSEC}; {JAMBA_CFG}: attn_layer_period 8, attn_layer_offset 4"),
        Setting("mixer.mamba.d_state", 16, f"{JAMBA_CFG}: mamba_d_state 16"),
        Setting("mixer.mamba.d_conv", 4, f"{JAMBA_CFG}: mamba_d_conv 4"),
        Setting("mixer.mamba.expand", 2, f"{JAMBA_CFG}: mamba_expand 2"),
        Setting("mixer.mamba.dt_rank", 0, f"{JAMBA_CFG}: mamba_dt_rank 256 = ceil(4096 / 16), abl's 0"),
        Setting("mixer.mamba.conv_bias", True, f"{JAMBA_CFG}: mamba_conv_bias true"),
        Setting("mixer.mamba.bias", False, f"{JAMBA_CFG}: mamba_proj_bias false"),
        *_attention("mha", per_head(0.25, "n_heads / 4"), f"{JAMBA_CFG}: num_attention_heads 32, "
                    "num_key_value_heads 8"),
        Setting("model.ffn", "moe", f"{JAMBA} (MoE replaces some MLPs)"),
        Setting("ffn.moe.routing", "token_choice", f"{JAMBA_CFGSEC}: top-K experts per token"),
        Setting("ffn.moe.n_experts", 16, f"{JAMBA_CFGSEC}: n = 16"),
        Setting("ffn.moe.top_k", 2, f"{JAMBA_CFGSEC}: K = 2"),
        Setting("ffn.moe.n_shared_experts", 0, JAMBA_CFG),
        Setting("ffn.moe.expert", "swiglu", f"{JAMBA_CFG}: hidden_act silu (gated MLP)"),
        Setting("ffn.moe.expert_ratio", 14336 / 4096, f"{JAMBA_CFG}: intermediate_size 14336 / hidden_size 4096"),
        Setting("ffn.moe.bias", False, JAMBA_CFG),
        Setting("ffn.moe.aux_loss_coef", 0.001, f"{JAMBA_CFG}: router_aux_loss_coef 0.001"),
        Setting("ffn.moe.router_z_loss_coef", 0.0, f"{JAMBA_CFG} (no router z-loss)"),
        Setting("model.tie_embeddings", False, f"{JAMBA_CFG}: tie_word_embeddings false"),
    ]


RECIPES = {
    "llama": (llama, f"Llama 2 7B: pre-RMSNorm, RoPE, SwiGLU, MHA ({LLAMA2}).", (
        "Llama 2 34B/70B use GQA with 8 KV heads: set mixer.mha.n_kv_heads for them.",
    )),
    "gpt2": (gpt2, f"GPT-2: pre-LayerNorm, learned positions, GELU, biases, tied embeddings ({GPT2}).", (
        "GELU is the tanh approximation (gelu_new); abl's gelu FFN is the exact erf form.",
        "attention-probability and embedding dropout (attn_pdrop, embd_pdrop 0.1): abl has residual dropout only.",
    )),
    "gemma2": (gemma2, f"Gemma 2: sandwich RMSNorm, alternating local/global GQA, soft-capping, GeGLU ({GEMMA2}).", (
        "head size 256 independent of d_model / n_heads: abl derives head_dim; set model.head_dim to match.",
        "GeGLU's GELU is the tanh approximation (gelu_pytorch_tanh); abl's geglu uses the exact erf form.",
        "RMSNorm scales by (1 + w), w initialised at 0: the same function at init, another parametrisation.",
    )),
    "olmo2": (olmo2, f"OLMo 2 7B: reordered (post-branch) RMSNorm, QK-norm, RoPE 5e5, SwiGLU ({OLMO2}).", (
        "QK-norm over the whole q/k projection (q_norm of width n_heads x head_dim); abl's qk_norm is per head.",
    )),
    "mistral": (mistral, f"Mistral 7B: sliding-window GQA (n_heads/4), pre-RMSNorm, SwiGLU 3.5 ({MISTRAL}).", (
        "the rolling-buffer KV cache (sec. 2) changes inference memory, not the function: not modelled.",
    )),
    "qwen3": (qwen3, f"Qwen3-8B: GQA (n_heads/4) with per-head QK-norm, RoPE 1e6, SwiGLU 3.0 ({QWEN3}).", (
        "Qwen3-0.6B/1.7B/4B tie embeddings and 0.6B/1.7B use n_heads/2 KV heads: this is the 8B layout.",
    )),
    "deepseek_v3_small": (deepseek_v3_small, (f"A small DeepSeek-V3: MLA + DeepSeekMoE, 1 shared + 16 routed "
                                              f"experts, top-2 ({DSV3})."), (
        "routed experts scaled down (256 routed, 8 active in the paper; 16 and 2 here).",
        ("sigmoid affinities normalised over the selected experts and auxiliary-loss-free balancing (a bias "
         "b_i that only picks the experts, sec. 2.1.2): abl's router is softmax top-k with a batch-wise "
         "load-balancing loss."),
        "the balance loss is sequence-wise in the paper (sec. 2.1.2); abl's is batch-wise.",
        "the first three layers are dense FFNs in the paper; abl uses one FFN kind for every layer.",
        "multi-token prediction (sec. 2.2): not in abl.",
        ("the routed scaling factor: the paper's model multiplies the normalised routed gates by 2.5 "
         "(config.json of deepseek-ai/DeepSeek-V3: routed_scaling_factor 2.5; modeling_deepseek.py): abl's "
         "routed output is not scaled."),
        ("group-limited routing: node-limited routing (sec. 2.1.2, M = 4 nodes), in the released model "
         "n_group 8, topk_group 4 (config.json: each token's experts come from the 4 of 8 expert groups "
         "with the highest sum of their top-2 affinities): abl picks the top-k over all experts."),
    )),
    "jamba": (jamba, (f"Jamba: Mamba + attention 7:1 per 8-layer block, MoE 16 experts top-2, no positions "
                      f"({JAMBA})."), (
        ("MoE every other layer (e = 2) with dense MLPs between: abl uses one FFN kind for every layer, so "
         "every layer is MoE here."),
        "RMSNorm inside the Mamba layers (on dt, B, C; sec. 6): not in abl's mamba mixer.",
        "the 8-layer pattern needs model.n_layers a multiple of 8.",
        ("the top-2 router weights are the softmax probabilities of the chosen experts, not renormalised "
         "(transformers' modeling_jamba.py, JambaSparseMoeBlock): abl's token_choice renormalises them to "
         "sum to 1 (GShard), so its MoE output is larger by 1 / (p1 + p2) at the same router."),
    )),
}


@hookimpl
def register_recipes(register):
    for name, (settings, doc, gaps) in RECIPES.items():
        register(name, settings(), doc=doc, gaps=gaps)
