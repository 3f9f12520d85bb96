"""One entry per MoE model family: which config.json keys give its geometry, which layers
are MoE layers, and where the routed experts' tensors are in its checkpoint.

Adding a family is adding one `Family(...)` below. Everything that reads a model — the
checkpoint loader, `kt convert`, the transformers integration — goes through these entries;
nothing else in kt branches on a model's name. Key lists are tried in order, so families
whose configs spell a field differently (MiniMax has no `num_experts`) need no special code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kt_core.errors import KTError


@dataclass(frozen=True)
class ExpertNames:
    """Per-expert tensors: `{prefix}.{expert}.{gate|up|down}.weight` (plus quantization suffixes)."""
    gate: str = "gate_proj"
    up: str = "up_proj"
    down: str = "down_proj"


@dataclass(frozen=True)
class FusedExperts:
    """All experts of a layer in two tensors (GPT-OSS, Qwen3-VL-MoE):
    `{prefix}.{gate_up}` [E, H, 2I] and `{prefix}.{down}` [E, I, H] (input dimension first).
    gate and up are the two halves of the last axis, or its even/odd columns (`interleaved`).
    transformers saves some families in its own orientation, [E, 2I, H] and [E, H, I], which is read
    too (down's shape tells them apart); `output_first`: the family's checkpoints are stored so (Gemma 4:
    no conversion on the hub), which decides where the shapes cannot (hidden == intermediate)."""
    gate_up: str = "gate_up_proj"
    down: str = "down_proj"
    interleaved: bool = False
    output_first: bool = False


@dataclass(frozen=True)
class StackedExperts:
    """Each projection of all a layer's experts in one tensor (Step-3.7): `{prefix}.{gate}.weight`
    and `{prefix}.{up}.weight` [E, I, H], `{prefix}.{down}.weight` [E, H, I] (plus quantization
    suffixes, as per-expert tensors have them)."""
    gate: str = "gate_proj"
    up: str = "up_proj"
    down: str = "down_proj"


@dataclass(frozen=True)
class TransformersExperts:
    """Where a transformers (5.x) MoE block keeps its routed experts: the block calls
    `block.{attr}(hidden [T, H], top_k_index [T, k], top_k_weights [T, k]) -> [T, H]` after its
    own router, and that module holds `{gate_up}` [E, 2I, H] (I gate rows, then I up rows) and
    `{down}` [E, H, I] — or, `input_first`, [E, H, 2I] (gate and up as halves, or `interleaved`:
    GPT-OSS's even / odd columns) and [E, I, H], GPT-OSS's with `{gate_up}_bias` [E, 2I]
    (interleaved the same way) and `{down}_bias` [E, H]. kt.integrations.transformers replaces that
    one module."""
    attr: str = "experts"
    gate_up: str = "gate_up_proj"
    down: str = "down_proj"
    input_first: bool = False
    interleaved: bool = False    # input_first's gate / up as even / odd columns (GPT-OSS), else halves
    # Llama 4: the block calls its experts on the input scaled by each token's routing score (a
    # sigmoid of its top-1 logit), every expert over every token (scaled_input.py hooks the block).
    scaled_input: bool = False


# What each `Family.activation` computes, for messages. kt computes them all: "silu" in every
# kernel, the clamped forms through MoE(swiglu_limit, swiglu_alpha[, expert_bias=True]), the limit
# after SiLU and GELU-tanh in kt-core on the kernels' raw gate/up products.
ACTIVATIONS = {
    "silu": "SiLU(x·gateᵀ) * (x·upᵀ), then ·downᵀ, without biases",
    "clamped-silu": "SiLU(min(g, limit)) * clamp(u, -limit, limit) (g = x·gateᵀ, u = x·upᵀ; limit: the config's "
                    "swiglu_limit), then ·downᵀ, without biases",
    "swiglu-oai": "a clamped SwiGLU ((clamp(up) + 1) * g * sigmoid(alpha g), g = min(gate, limit); the config's "
                  "swiglu_limit / swiglu_alpha)",
    "silu-limit-after": "min(SiLU(g), limit) * clamp(u, -limit, limit) (g = x·gateᵀ, u = x·upᵀ; limit: the config's "
                        "per-layer swiglu_limits, 0 = SiLU), then ·downᵀ, without biases",
    "gelu-tanh": "GELU-tanh(x·gateᵀ) * (x·upᵀ) (GELU's tanh form: the config's hidden_activation gelu_pytorch_tanh), "
                 "then ·downᵀ, without biases",
}
# The hidden_activation names of GELU's tanh form (transformers' ACT2FN): what "gelu-tanh" experts may say.
GELU_TANH_NAMES = ("gelu_pytorch_tanh", "gelu_new", "gelu_tanh")


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]                  # config.json "model_type" values
    experts_key: tuple[str, ...]                  # routed experts per layer
    intermediate_key: tuple[str, ...] = ("moe_intermediate_size",)
    top_k_key: tuple[str, ...] = ("num_experts_per_tok",)
    hidden_key: tuple[str, ...] = ("hidden_size",)
    layers_key: tuple[str, ...] = ("num_hidden_layers",)
    # Which layers are MoE: not among the first `dense_prefix_key` layers, not after
    # `last_sparse_key` (when >= 0), not listed in `dense_layers_key`, and on the family's stride:
    # L % step == offset (Qwen's decoder_sparse_step with offset step - 1, i.e. (L + 1) % step == 0;
    # Jamba's expert_layer_period / expert_layer_offset) and L % freq == 0 (DeepSeek's moe_layer_freq).
    # Where the config lists every layer's kind (`layer_types_key`, transformers 5's
    # mlp_layer_types: "sparse" / "dense"), that list decides.
    dense_prefix_key: str | None = None
    dense_prefix_default: int = 0        # dense leading layers where the config names none (transformers' default)
    sparse_step_key: str | None = None
    sparse_offset_key: str | None = None   # where the step's MoE layer falls (default step - 1)
    layer_freq_key: str | None = None
    dense_layers_key: str | None = None
    dense_layers_default: tuple[int, ...] = ()   # where the config lists none (transformers' default)
    last_sparse_key: str | None = None
    layer_types_key: str | None = None
    sparse_layers_key: str | None = None   # the MoE layers listed (Llama 4's moe_layers): they decide
    moe_switch_key: str | None = None      # a flag turning every layer's MoE block on (Gemma 4); false: a dense model
    experts_prefix: str = "model.layers.{layer}.mlp.experts"
    per_expert: ExpertNames | None = field(default_factory=ExpertNames)
    fused: FusedExperts | None = None
    stacked: StackedExperts | None = None
    # What the experts compute. kt's kernels compute SiLU(x·gateᵀ) * (x·upᵀ) then ·downᵀ with
    # no biases ("silu"); a family whose experts differ is readable but refused at run time.
    activation: str = "silu"
    # The experts add biases to gate/up and down (GPT-OSS): read with the weights, computed by
    # kt_core.MoE(expert_bias=True).
    expert_biases: bool = False
    # A checkpoint quantized as FP8 (its quantization_config) may keep the experts in MXFP4 instead:
    # int8 E2M1 pairs in `.weight`, a UE8M0 `.scale` per 32 (DeepSeek-V4's own checkpoints). The
    # first expert's dtype decides (kt.weights.Checkpoint).
    mxfp4_experts_in_fp8: bool = False
    text_config_key: str | None = None            # multimodal configs nest the text model (a dotted path)
    # The transformers MoE block class names for this family (kt.integrations.transformers).
    transformers_blocks: tuple[str, ...] = ()
    transformers_experts: TransformersExperts = field(default_factory=TransformersExperts)

    def swiglu(self, setting, layer: int) -> tuple[float, float, bool, str]:
        """(swiglu_limit, swiglu_alpha, swiglu_limit_after_act, gate_activation) of layer `layer`'s experts,
        kt_core.MoE's terms: (0, 0, False, "silu") for SiLU; `setting(key, default)` reads the model's
        config (GPT-OSS's / MiniMax-M3's defaults 7 and 1.702, DeepSeek-V4's limit 10, as transformers'
        configs have them; Step-3.5's / Ling-2.5's limits one per layer, 0 where a layer has none;
        Gemma 4's hidden_activation)."""
        if self.activation == "silu":
            return 0.0, 0.0, False, "silu"
        if self.activation == "gelu-tanh":
            act = setting("hidden_activation", "gelu_pytorch_tanh")
            if act not in GELU_TANH_NAMES:
                raise KTError(f"this model's experts use hidden_activation={act!r}; kt computes GELU's tanh form for "
                              f"this family ({', '.join(GELU_TANH_NAMES)})")
            return 0.0, 0.0, False, "gelu_tanh"
        if self.activation == "clamped-silu":
            limit = setting("swiglu_limit", 10.0)
            if isinstance(limit, bool) or not isinstance(limit, int | float) or not limit > 0:
                raise KTError(f"config swiglu_limit should be a positive number (the experts' clamp), found {limit!r}")
            return float(limit), 0.0, False, "silu"
        if self.activation == "silu-limit-after":
            key = next((k for k in ("swiglu_limits", "expert_swiglu_limit_list") if setting(k, None) is not None), None)
            limits = setting(key, None) if key else []
            if not isinstance(limits, list | tuple) or not all(
                    x is None or (isinstance(x, int | float) and not isinstance(x, bool) and x >= 0) for x in limits):
                raise KTError(f"config {key} should list each layer's limit (a number >= 0; 0 or null = none), found "
                              f"{limits!r}")
            limit = float(limits[layer] or 0.0) if layer < len(limits) else 0.0
            return limit, 0.0, limit > 0, "silu"
        return float(setting("swiglu_limit", 7.0)), float(setting("swiglu_alpha", 1.702)), False, "silu"

    def text_config(self, cfg):
        """The language model's config in `cfg` (config.json's dict or a transformers config): the
        text_config_key path, a key or attribute per step (Qwen3-Omni's thinker_config.text_config);
        `cfg` itself where the family has none or the path is absent (configs keeping the text keys at
        the top level)."""
        node = cfg
        for part in (self.text_config_key or "").split(".") if self.text_config_key else ():
            node = node.get(part) if isinstance(node, dict) else getattr(node, part, None)
            if node is None:
                return cfg
        return node

    def expert_tensor(self, layer: int, expert: int, proj: str) -> str:
        """Name of one expert's projection weight (without the `.weight` suffix)."""
        assert self.per_expert is not None
        prefix = self.experts_prefix.format(layer=layer)
        return f"{prefix}.{expert}.{getattr(self.per_expert, proj)}"


_DEEPSEEK = dict(experts_key=("n_routed_experts",), dense_prefix_key="first_k_dense_replace",
                 layer_freq_key="moe_layer_freq", layer_types_key="mlp_layer_types")
_LISTED_LAYERS = dict(layer_types_key="mlp_layer_types")
_QWEN_STRIDE = dict(sparse_step_key="decoder_sparse_step", dense_layers_key="mlp_only_layers")
_MIXTRAL_STYLE = dict(experts_key=("num_local_experts",), intermediate_key=("intermediate_size",),
                      experts_prefix="model.layers.{layer}.block_sparse_moe.experts",
                      per_expert=ExpertNames(gate="w1", up="w3", down="w2"))
# IBM Granite 3 MoE / Granite 4.0 hybrid (Mamba-2) MoE: every layer; checkpoints keep a layer's
# experts fused under block_sparse_moe, [E, 2I, H] / [E, H, I] (transformers renames them).
_GRANITE = dict(experts_key=("num_local_experts",), intermediate_key=("intermediate_size",),
                experts_prefix="model.layers.{layer}.block_sparse_moe", per_expert=None,
                fused=FusedExperts(gate_up="input_linear.weight", down="output_linear.weight", output_first=True))
# Families whose checkpoints hold what transformers' experts module holds, [E, 2I, H] / [E, H, I]
# under `experts` (no conversion rule).
_TRANSFORMERS_FUSED = dict(per_expert=None, fused=FusedExperts(output_first=True))
# Aria (Rhymes): experts input-first, [E, H, 2I] (halves) as fc1 and [E, I, H] as fc2; its routed
# experts use SiLU whatever hidden_act says.
_ARIA = dict(experts_key=("moe_num_experts",), top_k_key=("moe_topk",), intermediate_key=("intermediate_size",),
             per_expert=None, fused=FusedExperts(gate_up="fc1.weight", down="fc2.weight"),
             transformers_blocks=("AriaTextMoELayer",), transformers_experts=TransformersExperts(input_first=True))
_DOTS3 = dict(**_LISTED_LAYERS, experts_key=("n_routed_experts", "num_local_experts"),
              dense_prefix_key="first_k_dense_replace", dense_prefix_default=1, transformers_blocks=("Dots3NoteTextMoE",))
# Gemma 4 (26B-A4B): an MoE block beside every layer's dense MLP when enable_moe_block (the dense
# Gemma 4 models have none), its experts and router held by the decoder layer itself; GELU-tanh
# experts; checkpoints in transformers' own fused orientation ([E, 2I, H], [E, H, I]).
_GEMMA4 = dict(experts_key=("num_experts",), top_k_key=("top_k_experts",), moe_switch_key="enable_moe_block",
               per_expert=None, fused=FusedExperts(output_first=True), activation="gelu-tanh",
               transformers_blocks=("Gemma4TextDecoderLayer",))
# Llama 4 (Scout, Maverick: top-1 routing): MoE layers listed (moe_layers) or every
# interleave_moe_layer_step-th; stored fused, [E, H, 2I] with gate and up as halves.
_LLAMA4 = dict(experts_key=("num_local_experts",), intermediate_key=("intermediate_size",),
               sparse_step_key="interleave_moe_layer_step", sparse_layers_key="moe_layers", per_expert=None,
               fused=FusedExperts(), transformers_blocks=("Llama4TextMoe",),
               transformers_experts=TransformersExperts(input_first=True, scaled_input=True))

FAMILIES: tuple[Family, ...] = (
    # DeepseekV2MoE / DeepseekV3MoE are also the block names of the modeling code DeepSeek's and
    # Kimi-K2's checkpoints ship (trust_remote_code: one module per expert, expert_modules.py).
    Family("deepseek", ("deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2"), **_DEEPSEEK,
           transformers_blocks=("DeepseekV2Moe", "DeepseekV2MoE", "DeepseekV3MoE", "DeepseekV32MoE")),
    # DeepSeek-V4 (Flash, Pro): every layer MoE (the first few hash-routed: the block's own router,
    # kt sees ids and weights), the clamped SiLU, experts per expert as w1 / w3 / w2 under `ffn` —
    # `layers.L.ffn.experts` in DeepSeek's own checkpoints (kt.weights.Checkpoint reads names
    # without transformers' `model.` too), MXFP4 there under an FP8 quantization_config.
    Family("deepseek-v4", ("deepseek_v4",), experts_key=("n_routed_experts", "num_local_experts"),
           experts_prefix="model.layers.{layer}.ffn.experts", per_expert=ExpertNames(gate="w1", up="w3", down="w2"),
           activation="clamped-silu", mxfp4_experts_in_fp8=True, transformers_blocks=("DeepseekV4SparseMoeBlock",)),
    # Kimi-K2.5: multimodal, its language model a DeepSeek-V3 (text_config), stored under language_model.model.
    Family("kimi-k2.5", ("kimi_k25",), **_DEEPSEEK, text_config_key="text_config",
           experts_prefix="language_model.model.layers.{layer}.mlp.experts", transformers_blocks=("DeepseekV3MoE",)),
    # transformers 5 saves Qwen3-MoE's expert count as num_local_experts.
    # qwen3_5_moe_text: Qwen3.5-MoE's language model alone, as transformers' causal-LM class holds and saves it.
    Family("qwen-moe", ("qwen2_moe", "qwen3_moe", "qwen3_next", "qwen3_5_moe_text"),
           experts_key=("num_experts", "num_local_experts"), **_QWEN_STRIDE,
           transformers_blocks=("Qwen2MoeSparseMoeBlock", "Qwen3MoeSparseMoeBlock", "Qwen3NextSparseMoeBlock",
                                "Qwen3_5MoeSparseMoeBlock")),
    # Qwen3.5-MoE's own (multimodal) checkpoints: the text model nested, one tensor per expert.
    Family("qwen3.5-moe", ("qwen3_5_moe",), experts_key=("num_experts",), text_config_key="text_config",
           experts_prefix="model.language_model.layers.{layer}.mlp.experts",
           transformers_blocks=("Qwen3_5MoeSparseMoeBlock",)),
    # Qwen3-Omni: the thinker's language model is a Qwen3-MoE (thinker_config.text_config), one tensor per
    # expert under thinker.model (its talker's MoE blocks, another class, stay torch's); the thinker alone.
    Family("qwen3-omni-moe", ("qwen3_omni_moe",), experts_key=("num_experts",), **_QWEN_STRIDE,
           text_config_key="thinker_config.text_config", experts_prefix="thinker.model.layers.{layer}.mlp.experts",
           transformers_blocks=("Qwen3OmniMoeThinkerTextSparseMoeBlock",)),
    Family("qwen3-omni-moe-thinker", ("qwen3_omni_moe_thinker",), experts_key=("num_experts",), **_QWEN_STRIDE,
           text_config_key="text_config", transformers_blocks=("Qwen3OmniMoeThinkerTextSparseMoeBlock",)),
    Family("qwen3-vl-moe", ("qwen3_vl_moe",), experts_key=("num_experts", "num_local_experts"),
           **_QWEN_STRIDE, text_config_key="text_config",
           experts_prefix="model.language_model.layers.{layer}.mlp.experts", per_expert=None, fused=FusedExperts(),
           transformers_blocks=("Qwen3VLMoeTextSparseMoeBlock",)),
    Family("mixtral", ("mixtral",), **_MIXTRAL_STYLE, transformers_blocks=("MixtralSparseMoeBlock",)),
    # Phi-3.5-MoE: Mixtral's layout (its sparsemixer routing is the block's own).
    Family("phimoe", ("phimoe",), **_MIXTRAL_STYLE, transformers_blocks=("PhimoeSparseMoeBlock",)),
    Family("granite-moe", ("granitemoe", "granitemoeshared", "granitemoehybrid"), **_GRANITE,
           transformers_blocks=("GraniteMoeMoE", "GraniteMoeSharedMoE", "GraniteMoeHybridMoE")),
    # Granite SWA MoE: no conversion rule, its checkpoints hold transformers' names.
    Family("granite-moe-swa", ("granitemoe_swa",), **{**_GRANITE, **_TRANSFORMERS_FUSED,
                                                      "experts_prefix": "model.layers.{layer}.block_sparse_moe.experts"},
           transformers_blocks=("GraniteMoeSWAMoE",)),
    # Jamba (AI21; Mamba + attention): MoE on every expert_layer_period-th layer from expert_layer_offset.
    Family("jamba", ("jamba",), experts_key=("num_experts", "num_local_experts"), intermediate_key=("intermediate_size",),
           sparse_step_key="expert_layer_period", sparse_offset_key="expert_layer_offset",
           experts_prefix="model.layers.{layer}.feed_forward.experts", transformers_blocks=("JambaSparseMoeBlock",)),
    # LFM2-MoE (Liquid): after num_dense_layers dense layers; Mixtral's names under feed_forward.
    Family("lfm2-moe", ("lfm2_moe",), experts_key=("num_experts",), dense_prefix_key="num_dense_layers",
           dense_prefix_default=2, experts_prefix="model.layers.{layer}.feed_forward.experts",
           per_expert=ExpertNames(gate="w1", up="w3", down="w2"), transformers_blocks=("Lfm2MoeSparseMoeBlock",)),
    # Standard per-expert layout; Flint's mlp_only_layers defaults to its first two layers.
    Family("mellum", ("mellum",), **_LISTED_LAYERS, experts_key=("num_local_experts", "num_experts"),
           transformers_blocks=("MellumSparseMoeBlock",)),
    Family("flint", ("flint",), **_QWEN_STRIDE, dense_layers_default=(0, 1), experts_key=("num_experts",),
           transformers_blocks=("FlintSparseMoeBlock",)),
    Family("beam", ("beam",), **_LISTED_LAYERS, experts_key=("num_experts",), dense_prefix_default=3,
           transformers_blocks=("BeamMoE",)),
    Family("kolibri1", ("kolibri1", "kolibri1_1"), experts_key=("num_local_experts", "num_experts"),
           transformers_blocks=("Kolibri1SparseMoeBlock", "Kolibri1_1SparseMoeBlock")),
    # dots.llm3-note: its vision tower has MoE blocks of the same experts class (only the text block is kt's);
    # the published configs keep the text keys at the top level.
    Family("dots3-note", ("dots3_note",), **_DOTS3, text_config_key="text_config"),
    Family("dots3-note-text", ("dots3_note_text",), **_DOTS3),
    # Families without a conversion rule: checkpoints as transformers' experts hold them (ZAYA1: top-1,
    # its skip choice reaching kt as expert 0 with weight 0, and hidden == intermediate).
    Family("inkling-text", ("inkling_text",), **_LISTED_LAYERS, **_TRANSFORMERS_FUSED,
           experts_key=("n_routed_experts", "num_local_experts"), dense_prefix_key="dense_mlp_idx",
           transformers_blocks=("InklingMoE",)),
    Family("zaya", ("zaya",), **_TRANSFORMERS_FUSED, experts_key=("num_experts",), transformers_blocks=("ZayaSparseMoeBlock",)),
    Family("lara-mini", ("lara_mini",), **_TRANSFORMERS_FUSED, experts_key=("num_experts",),
           transformers_blocks=("LaraMiniSparseMoeBlock",)),
    Family("aria", ("aria",), **_ARIA, text_config_key="text_config",
           experts_prefix="language_model.model.layers.{layer}.mlp.experts"),
    Family("aria-text", ("aria_text",), **_ARIA),
    Family("minimax", ("minimax", "minimax_m2"), **_MIXTRAL_STYLE,
           transformers_blocks=("MiniMaxSparseMoeBlock", "MiniMaxM2SparseMoeBlock")),
    # GLM-4.5 / 4.6 / 4.7 (glm4_moe), GLM-4.7-Flash (glm4_moe_lite), GLM-5 (glm_moe_dsa).
    Family("glm4-moe", ("glm4_moe", "glm4_moe_lite", "glm_moe_dsa"), experts_key=("n_routed_experts",),
           dense_prefix_key="first_k_dense_replace", layer_types_key="mlp_layer_types",
           transformers_blocks=("Glm4MoeMoE", "Glm4MoeLiteMoE", "GlmMoeDsaMoE")),
    Family("dots1", ("dots1",), experts_key=("n_routed_experts",), dense_prefix_key="first_k_dense_replace",
           transformers_blocks=("Dots1MoE",)),
    Family("ernie4.5-moe", ("ernie4_5_moe",), experts_key=("moe_num_experts",), top_k_key=("moe_k",),
           dense_prefix_key="moe_layer_start_index", last_sparse_key="moe_layer_end_index",
           sparse_step_key="moe_layer_interval", transformers_blocks=("Ernie4_5_MoeSparseMoeBlock",)),
    # HunYuan-A13B: moe_topk (one per layer on the hub), the experts' size in intermediate_size.
    Family("hunyuan-moe", ("hunyuan_v1_moe",), experts_key=("num_experts",), intermediate_key=("intermediate_size",),
           top_k_key=("moe_topk",), transformers_blocks=("HunYuanMoEV1Moe",)),
    # Families transformers 5 holds in its standard layout, their MoE layers listed in mlp_layer_types
    # where the config has it, else after the leading dense layers transformers assumes.
    Family("mimo-v2-flash", ("mimo_v2_flash",), **_LISTED_LAYERS, experts_key=("n_routed_experts",),
           dense_prefix_default=1, transformers_blocks=("MiMoV2FlashMoE",)),
    Family("minicpm5-moe", ("minicpm5_moe",), **_LISTED_LAYERS, experts_key=("n_routed_experts",),
           dense_prefix_key="first_k_dense_replace", dense_prefix_default=1, transformers_blocks=("MiniCPM5MoeMoE",)),
    Family("exaone-moe", ("exaone_moe",), **_LISTED_LAYERS, experts_key=("num_experts",),
           dense_prefix_key="first_k_dense_replace", dense_prefix_default=1, transformers_blocks=("ExaoneMoeSparseMoEBlock",)),
    Family("solar-open", ("solar_open",), experts_key=("n_routed_experts",), transformers_blocks=("SolarOpenMoE",)),
    Family("laguna", ("laguna",), **_LISTED_LAYERS, experts_key=("num_experts",), dense_prefix_default=1,
           transformers_blocks=("LagunaSparseMoeBlock",)),
    Family("afmoe", ("afmoe",), experts_key=("num_experts",), dense_prefix_key="num_dense_layers",
           transformers_blocks=("AfmoeSparseMoeBlock",)),
    # Command A MoE: the experts' size is intermediate_size (the dense layers' is prefix_dense_intermediate_size).
    Family("cohere2-moe", ("cohere2_moe",), **_LISTED_LAYERS, experts_key=("num_experts",),
           intermediate_key=("intermediate_size",), dense_prefix_key="first_k_dense_replace",
           transformers_blocks=("Cohere2MoeSparseMoeBlock",)),
    # Tencent Hunyuan 3 / 4 (HY-V4: DeepSeek-V4's clamped SiLU; its checkpoints keep the experts fused).
    Family("hy-v3", ("hy_v3",), **_LISTED_LAYERS, experts_key=("num_experts",), dense_prefix_default=1,
           transformers_blocks=("HYV3MoE",)),
    Family("hy-v4", ("hy_v4",), **_LISTED_LAYERS, experts_key=("n_routed_experts",), dense_prefix_default=1,
           per_expert=None, fused=FusedExperts(), activation="clamped-silu", transformers_blocks=("HYV4MoE",)),
    # Kimi-Linear (Moonshot): Mixtral's w1 / w3 / w2 names under block_sparse_moe.
    Family("kimi-linear", ("kimi_linear",), **_LISTED_LAYERS, experts_key=("num_experts", "num_local_experts"),
           top_k_key=("num_experts_per_token", "num_experts_per_tok"), dense_prefix_key="first_k_dense_replace",
           dense_prefix_default=1, experts_prefix="model.layers.{layer}.block_sparse_moe.experts",
           per_expert=ExpertNames(gate="w1", up="w3", down="w2"), transformers_blocks=("KimiLinearMoE",)),
    # LongCat-Flash: one MoE per decoder layer (num_layers; transformers' num_hidden_layers counts both
    # attention sublayers); its zero-computation experts reach kt as real ids of weight 0 (skipped).
    Family("longcat-flash", ("longcat_flash",), experts_key=("n_routed_experts",),
           intermediate_key=("expert_ffn_hidden_size", "moe_intermediate_size"),
           top_k_key=("moe_topk", "num_experts_per_tok"), layers_key=("num_layers",),
           transformers_blocks=("LongcatFlashMoE",)),
    # Mistral 4: its causal-LM class is registered with AutoModelForImageTextToText only (load_model
    # finds it there); checkpoints as transformers saves them, the experts fused.
    Family("mistral4", ("mistral4",), experts_key=("n_routed_experts",), dense_prefix_key="first_k_dense_replace",
           per_expert=None, fused=FusedExperts(), transformers_blocks=("Mistral4MoE",)),
    # Ling-2.5 / Ring-2.5 (Ant's hybrid linear-attention MoE): the limit after SiLU, one per layer
    # (expert_swiglu_limit_list, 0 = none), applied by kt-core to the raw gate/up products.
    Family("bailing-hybrid", ("bailing_hybrid",), **_LISTED_LAYERS, experts_key=("num_experts", "num_local_experts"),
           top_k_key=("num_experts_per_token", "num_experts_per_tok"), dense_prefix_key="first_k_dense_replace",
           dense_prefix_default=2, activation="silu-limit-after", transformers_blocks=("BailingHybridMoE",)),
    # Step-3.7 (StepFun): the limit after SiLU on a few layers (swiglu_limits), each projection of the
    # layer's experts stacked in one tensor under `moe`; MoE layers listed in mlp_layer_types or the
    # hub's moe_layers_enum, else every layer from the fourth.
    Family("step3p7", ("step3p7",), **_LISTED_LAYERS, experts_key=("n_routed_experts", "moe_num_experts"),
           top_k_key=("num_experts_per_tok", "moe_top_k"), sparse_layers_key="moe_layers_enum", dense_prefix_default=3,
           activation="silu-limit-after", text_config_key="text_config", experts_prefix="model.layers.{layer}.moe",
           per_expert=None, stacked=StackedExperts(), transformers_blocks=("Step3p7SparseMoeBlock",)),
    # Multimodal models whose language model is an MoE of that layout (text_config; no causal-LM class).
    Family("glm4v-moe", ("glm4v_moe",), experts_key=("n_routed_experts",), dense_prefix_key="first_k_dense_replace",
           text_config_key="text_config", experts_prefix="model.language_model.layers.{layer}.mlp.experts",
           transformers_blocks=("Glm4vMoeTextMoE",)),
    Family("glm5-next", ("glm5_next",), **_LISTED_LAYERS, experts_key=("n_routed_experts",), dense_prefix_default=3,
           activation="clamped-silu", text_config_key="text_config",
           experts_prefix="model.language_model.layers.{layer}.mlp.experts", transformers_blocks=("Glm5NextTextMoE",)),
    # Mistral Large 4: Mistral's own checkpoint names (no model. prefix, experts straight under the layer).
    Family("mistral-large4", ("mistral_large4",), **_LISTED_LAYERS, experts_key=("n_routed_experts",),
           dense_prefix_key="first_k_dense_replace", dense_prefix_default=1, text_config_key="text_config",
           experts_prefix="layers.{layer}.experts", per_expert=ExpertNames(gate="w1", up="w3", down="w2"),
           transformers_blocks=("MistralLarge4TextMoE",)),
    # MiniMax-M3: GPT-OSS's clamped SwiGLU without biases; the experts' size is intermediate_size.
    Family("minimax-m3", ("minimax_m3_vl",), **_LISTED_LAYERS, experts_key=("num_local_experts", "num_experts"),
           intermediate_key=("intermediate_size",), activation="swiglu-oai", text_config_key="text_config",
           experts_prefix="language_model.model.layers.{layer}.block_sparse_moe.experts",
           per_expert=ExpertNames(gate="w1", up="w3", down="w2"), transformers_blocks=("MiniMaxM3VLSparseMoeBlock",)),
    # Qwen4 (experimental): every layer MoE. Its multimodal checkpoints nest the language model (under
    # model.language_model, as transformers' conversion rules for it say); qwen4_exp_text: the text
    # model transformers' causal-LM class holds and saves.
    Family("qwen4-exp", ("qwen4_exp",), experts_key=("num_experts",), text_config_key="text_config",
           experts_prefix="model.language_model.layers.{layer}.mlp.experts",
           transformers_blocks=("Qwen4ExpTextSparseMoeBlock",)),
    Family("qwen4-exp-text", ("qwen4_exp_text",), experts_key=("num_experts",),
           transformers_blocks=("Qwen4ExpTextSparseMoeBlock",)),
    # Gemma 4 as released (Gemma4ForConditionalGeneration: the language model under model.language_model)
    # and its text model alone (Gemma4ForCausalLM).
    Family("gemma4", ("gemma4",), **_GEMMA4, text_config_key="text_config",
           experts_prefix="model.language_model.layers.{layer}.experts"),
    Family("gemma4-text", ("gemma4_text",), **_GEMMA4, experts_prefix="model.layers.{layer}.experts"),
    # OLMoE, FlexOlmo.
    Family("olmoe", ("olmoe", "flex_olmo"), experts_key=("num_experts", "num_local_experts"),
           intermediate_key=("intermediate_size",), transformers_blocks=("OlmoeSparseMoeBlock", "FlexOlmoSparseMoeBlock")),
    Family("gpt-oss", ("gpt_oss",), experts_key=("num_local_experts",), intermediate_key=("intermediate_size",),
           top_k_key=("num_experts_per_tok", "experts_per_token"), per_expert=None,
           fused=FusedExperts(interleaved=True), activation="swiglu-oai", expert_biases=True,
           transformers_blocks=("GptOssMLP",),
           transformers_experts=TransformersExperts(input_first=True, interleaved=True)),
    # Llama 4's language model alone (Llama4ForCausalLM).
    Family("llama4", ("llama4_text",),
           **_LLAMA4, experts_prefix="model.layers.{layer}.feed_forward.experts"),
    # Llama 4 as released (Llama4ForConditionalGeneration): the language model nested, saved under language_model.
    Family("llama4-multimodal", ("llama4",), **_LLAMA4, text_config_key="text_config",
           experts_prefix="language_model.model.layers.{layer}.feed_forward.experts"),
)


def family_for(model_type: str) -> Family:
    for fam in FAMILIES:
        if model_type in fam.model_types:
            return fam
    known = sorted(t for f in FAMILIES for t in f.model_types)
    raise KTError(f"model_type {model_type!r} is not an MoE family kt knows; supported: {', '.join(known)}")
