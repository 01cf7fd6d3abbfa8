"""What of upstream's SA3 config space these modules build, and one-line errors for the rest.

Upstream builds its modules straight from ``model_config.json`` with ``**kwargs``, so an absent
key means the upstream constructor default; the tables here name the options SA3 leaves at one
value, and :class:`Section` reads a JSON object so every error names the exact key.
"""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A model config these modules cannot build (the message is one line)."""


class Section:
    """One JSON object of the config plus its path, so errors can name the exact key."""

    def __init__(self, data: Any, where: str):
        if not isinstance(data, dict):
            raise ConfigError(f"malformed SA3 config: {where} is missing or not an object")
        self.data, self.where = data, where

    def get(self, key: str, default: Any = None, allowed: tuple | None = None) -> Any:
        """``key``'s value or the upstream default; ``allowed`` lists the values we build."""
        value = self.data.get(key, default)
        if allowed is not None and value not in allowed:
            raise ConfigError(
                f"unsupported SA3 config: {self.where}.{key}={value!r} (supported: {list(allowed)})"
            )
        return value

    def check(self, fixed: tuple[tuple[str, Any, tuple], ...]) -> None:
        for key, default, allowed in fixed:
            self.get(key, default, allowed)

    def sub(self, key: str) -> Section:
        """A required nested object."""
        return Section(self.data.get(key), f"{self.where}.{key}")

    def opt(self, key: str) -> Section:
        """An optional nested object (``{}`` when absent or null)."""
        return Section(self.data.get(key) or {}, f"{self.where}.{key}")

    def fail(self, problem: str) -> ConfigError:
        return ConfigError(f"malformed SA3 config: {self.where} {problem}")


# Upstream options SA3 leaves at one value; any other value would change keys or numerics.
# Each entry: (key, upstream default, the values built here).
DIT_FIXED = (
    ("patch_size", 1, (1,)),
    ("transformer_type", "continuous_transformer", ("continuous_transformer",)),
    ("global_cond_type", "prepend", ("adaLN",)),
    ("timestep_cond_type", "global", ("global",)),
    ("project_cond_tokens", True, (True,)),
    ("project_global_cond", True, (True,)),
    ("input_concat_dim", 0, (0,)),
    ("prepend_cond_dim", 0, (0,)),
    ("rotary_pos_emb", True, (True,)),
    ("cross_attn_rotary_pos_emb", False, (False,)),
    ("sliding_window", None, (None,)),
    ("final_cross_attn_ix", -1, (-1,)),
    ("modular_local_cond_configs", None, (None, [])),
    ("norm_type", "layer_norm", ("rms_norm",)),
    *(
        (flag, False, (False,))
        for flag in (
            "conformer",
            "use_sinusoidal_emb",
            "use_abs_pos_emb",
            "causal",
            "add_rope",
            "layer_scale",
        )
    ),
)
ATTN_FIXED = (("feat_scale", False, (False,)), ("qk_norm_eps", 1e-6, (1e-6,)))
FF_FIXED = (("glu", True, (True,)), ("use_conv", False, (False,)), ("sinusoidal", False, (False,)))
SAME_FIXED = tuple(
    (flag, False, (False,))
    for flag in ("conformer", "layer_scale", "feat_scale", "cross_attn", "freeze_backbone")
)
