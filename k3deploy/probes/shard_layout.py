"""The tensors a checkpoint's config implies, stdlib only: one tensor's verdict, and a whole header's in bulk
(shipped with the shard probe)."""
from __future__ import annotations

import math
from typing import Any

DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "F4": 4, "I16": 16,
              "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64}
SCALE_DTYPES = ("U8", "F8_E8M0")  # MXFP4 scales: E8M0 exponents, stored as either
EXPERTS = ".block_sparse_moe.experts."
W4A8_PARAM_WORDS = "F32 (msModelSlim's per-channel W4A8 parameters)"


class Layout:
    """The dtypes and shapes config.json implies: MXFP4 packed/scale pairs for routed experts, BF16 elsewhere; or,
    with msModelSlim's quant_model_description.json (the W4A8 checkpoint vLLM-Ascend's `--quantization ascend`
    loads), its W4A8 experts and the modules it quantizes."""

    def __init__(self, config: dict[str, Any], quant: dict[str, Any] | None = None) -> None:
        t = config.get("text_config") or config
        self.layers, hidden, vocab = int(t["num_hidden_layers"]), int(t["hidden_size"]), int(t["vocab_size"])
        self.expert_shapes: dict[str, list[int]] = {}
        # "<kind>" -> (the dtypes it may have, what they are): one width per kind, so bytes follow from the shape.
        self.expert_dtypes: dict[str, tuple[frozenset[str], str]] = {}
        # "<expert>.<kind>" -> (dtypes, shape, bytes) of every sound routed-expert tensor: one lookup for all.
        self.tails: dict[str, tuple[frozenset[str], list[int], int]] = {}
        # Modules (weight name without ".weight") the quant description quantizes, and as what.
        self.quantized = {k[:-len(".weight")]: v for k, v in (quant or {}).items()
                          if k.endswith(".weight") and isinstance(v, str) and v != "FLOAT"}
        if "text_config" not in config:  # not K3's layout (a flat config: Llama, DeepSeek): BF16 tensors only
            self.experts, self.first_moe = 0, 0
            self.exact = {n: [vocab, hidden] for n in ("model.embed_tokens.weight", "lm_head.weight")}
            self.moe_layers = frozenset[str]()
            return
        inter, latent = int(t["moe_intermediate_size"]), int(t["routed_expert_hidden_size"])
        self.experts, self.first_moe = int(t["num_experts"]), int(t.get("first_k_dense_replace", 0))
        # w1 = gate, w3 = up: latent -> inter; w2 = down: inter -> latent.
        dims = {"w1": (inter, latent), "w2": (latent, inter), "w3": (inter, latent)}
        if quant is None:
            group = int((config.get("quantization_config") or {}).get("group_size", 32))
            for w, (rows, cols) in dims.items():  # two E2M1 per byte, one E8M0 scale per group
                self.expert_shapes[f"{w}.weight_packed"] = [rows, cols // 2]
                self.expert_dtypes[f"{w}.weight_packed"] = (frozenset(("U8",)), "U8 (two E2M1 values per byte)")
                self.expert_shapes[f"{w}.weight_scale"] = [rows, cols // group]
                self.expert_dtypes[f"{w}.weight_scale"] = (frozenset(SCALE_DTYPES), "U8 or F8_E8M0 (E8M0 scales)")
        else:
            # msModelSlim's W4A8_DYNAMIC experts, per vLLM-Ascend's AscendW4A8DynamicFusedMoEMethod
            # (vllm_ascend/quantization/methods/w4a8.py): weight int8 [out // 2, in], two int4 per byte along the
            # output dim; per-channel weight_scale and weight_offset float32 [out, 1]; scale_bias float32
            # [out, 1] for gate/up and [out, 16] for down (16 // tp_size per rank).
            for w, (rows, cols) in dims.items():
                self.expert_shapes[f"{w}.weight"] = [rows // 2, cols]
                self.expert_dtypes[f"{w}.weight"] = (frozenset(("I8",)), "I8 (two int4 values per byte)")
                for param, width in (("weight_scale", 1), ("weight_offset", 1), ("scale_bias", 16 if w == "w2" else 1)):
                    self.expert_shapes[f"{w}.{param}"] = [rows, width]
                    self.expert_dtypes[f"{w}.{param}"] = (frozenset(("F32",)), W4A8_PARAM_WORDS)
        self.exact = {n: [vocab, hidden] for n in ("language_model.model.embed_tokens.weight",
                                                    "language_model.lm_head.weight")}
        self.moe_layers = frozenset(str(layer) for layer in range(self.first_moe, self.layers))
        for kind, want in self.expert_shapes.items():
            dtypes = self.expert_dtypes[kind][0]
            nbytes = math.prod(want) * DTYPE_BITS[next(iter(dtypes))] // 8  # a kind's dtypes share one width
            self.tails.update((f"{e}.{kind}", (dtypes, want, nbytes)) for e in range(self.experts))

    def plain(self, name: str, dtype: str) -> bool:
        """A non-expert tensor of a dtype this layout takes: BF16, the vision tower's own, or a module the quant
        description quantizes (int8 weights, its scales and offsets)."""
        module, _, param = name.rpartition(".")
        if module in self.quantized:
            return dtype == "I8" if param == "weight" else dtype in DTYPE_BITS
        return dtype == "BF16" or name.startswith("vision")

    def non_expert_problem(self, name: str, dtype: str, shape: list[int]) -> str | None:
        """None when a tensor outside the routed experts is what the config implies, else what is wrong."""
        if not self.plain(name, dtype):
            module, _, param = name.rpartition(".")
            if module in self.quantized and param == "weight":
                return f"dtype {dtype}, expected I8 (quant_model_description.json: {self.quantized[module]})"
            return f"dtype {dtype}, expected BF16"
        want = self.exact.get(name)
        return f"shape {shape}, expected {want}" if want is not None and shape != want else None

    @property
    def expert_count(self) -> int:
        """Routed-expert tensors a complete checkpoint has."""
        return (self.layers - self.first_moe) * self.experts * len(self.expert_shapes)

    def check(self, name: str, dtype: str, shape: list[int]) -> str | None:
        """None when the tensor is what the config implies, else what is wrong."""
        head, sep, tail = name.partition(EXPERTS)
        if not sep:
            return self.non_expert_problem(name, dtype, shape)
        sound = self.tails.get(tail)
        if sound is not None and head.rpartition(".")[2] in self.moe_layers and dtype in sound[0] \
                and shape == sound[1]:
            return None
        expert, _, kind = tail.partition(".")
        layer = head.rpartition(".")[2]
        if not (expert.isdigit() and int(expert) < self.experts and layer.isdigit()
                and self.first_moe <= int(layer) < self.layers and kind in self.expert_shapes):
            return "not a routed-expert tensor of this config"
        dtypes, words = self.expert_dtypes[kind]
        if dtype not in dtypes:
            return f"dtype {dtype}, expected {words}"
        want = self.expert_shapes[kind]
        return f"shape {shape}, expected {want}" if shape != want else None

    def sound_experts(self, header: dict[str, Any], data_bytes: int) -> int | None:
        """The routed-expert tensor count when every tensor of the header (without __metadata__) is well formed
        and what the config implies, and in header order they tile the data_bytes after the header; else None,
        and the per-tensor check says what is wrong. Accepts nothing that check would refuse."""
        tails, exact, count, cursor, last_head = self.tails, self.exact, 0, 0, None
        try:
            for tensor, info in header.items():
                dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
                # Writers put tensors in data order (safetensors does): so the span check needs no sort.
                if begin != cursor:
                    return None
                cursor = end
                head, sep, tail = tensor.partition(EXPERTS)
                want = tails.get(tail)
                if want is not None:
                    if dtype not in want[0] or shape != want[1] or end - begin != want[2]:
                        return None
                    if head != last_head:  # a shard holds a layer or two: the check once per run of one head
                        if head.rpartition(".")[2] not in self.moe_layers:
                            return None
                        last_head = head
                    count += 1
                    continue
                if sep or not self.plain(tensor, dtype):
                    return None
                nbytes = math.prod(shape) * DTYPE_BITS[dtype] // 8
                if end - begin != nbytes or nbytes < 0 or tensor in exact and shape != exact[tensor]:
                    return None
        except (KeyError, TypeError, ValueError):  # malformed: the per-tensor check names the entry
            return None
        return count if cursor == data_bytes else None
