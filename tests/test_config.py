"""Tests for hyperreg.config: dataclass defaults, dict round trips and validation."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hyperreg.config import ModelConfig, TrainConfig, from_dict, to_dict


def test_model_config_round_trip() -> None:
    cfg = ModelConfig(ndim=3, enc_channels=(8, 16, 16, 16), int_steps=5, parametrization="default")
    assert from_dict(ModelConfig, to_dict(cfg)) == cfg


def test_train_config_round_trip_nested() -> None:
    cfg = TrainConfig(
        data="x.csv",
        steps=10,
        lr=3e-4,
        sim="mse",
        model=ModelConfig(ndim=3, hyper_hidden=(32, 32), int_downsize=1),
    )
    values = to_dict(cfg)
    assert isinstance(values["model"], dict)
    assert values["model"]["ndim"] == 3
    restored = from_dict(TrainConfig, values)
    assert restored == cfg
    assert isinstance(restored.model, ModelConfig)


def test_round_trip_through_json() -> None:
    # JSON turns tuples into lists; from_dict turns them back, so equality still holds
    cfg = TrainConfig(model=ModelConfig(dec_channels=(16, 16, 16, 16, 16, 8, 8)))
    restored = from_dict(TrainConfig, json.loads(json.dumps(to_dict(cfg))))
    assert restored == cfg
    assert isinstance(restored.model.dec_channels, tuple)


def test_to_dict_is_plain() -> None:
    # documented: "Plain, JSON-ready dict of a config dataclass (tuples become lists)"
    values = to_dict(TrainConfig())
    assert isinstance(values["model"], dict)
    assert isinstance(values["model"]["enc_channels"], list)
    assert isinstance(values["model"]["hyper_hidden"], list)
    assert json.loads(json.dumps(values)) == values


def test_partial_dict_keeps_defaults() -> None:
    cfg = from_dict(TrainConfig, {"steps": 7, "model": {"ndim": 3}})
    assert cfg.steps == 7
    assert cfg.batch_size == TrainConfig().batch_size
    assert cfg.model == ModelConfig(ndim=3)


def test_unknown_keys_raise_and_are_named() -> None:
    with pytest.raises(
        ValueError, match=r"ModelConfig.from_dict\(\): unknown keys \['bogus', 'extra'\]"
    ):
        from_dict(ModelConfig, {"ndim": 2, "extra": 1, "bogus": 2})
    with pytest.raises(
        ValueError, match=r"TrainConfig.from_dict\(\): unknown keys \['learning_rate'\]"
    ):
        from_dict(TrainConfig, {"learning_rate": 0.1})
    with pytest.raises(ValueError, match=r"ModelConfig.from_dict\(\): unknown keys \['depth'\]"):
        from_dict(TrainConfig, {"model": {"depth": 5}})


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"ndim": 4}, r"'ndim' must be 2 or 3, got 4"),
        ({"ndim": 1}, r"'ndim' must be 2 or 3, got 1"),
        ({"parametrization": "hyper"}, r"'parametrization' must be one of \('mip', 'default'\)"),
        ({"int_downsize": 4}, r"'int_downsize' must be 1 or 2, got 4"),
        ({"int_steps": -1}, r"'int_steps' must be >= 0, got -1"),
        ({"hyper_rank": -2}, r"'hyper_rank' must be >= 0 \(0 = legacy head\), got -2"),
    ],
)
def test_invalid_model_config_raises(kwargs: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        ModelConfig(**kwargs)
    with pytest.raises(ValueError, match=pattern):
        from_dict(ModelConfig, kwargs)


def test_configs_are_frozen() -> None:
    cfg = ModelConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.ndim = 3  # type: ignore[misc]


def test_model_config_without_hyper_rank_still_reads() -> None:
    """A model config written before 'hyper_rank' existed is accepted (the field takes its
    default here; load_checkpoint supplies the legacy value 0 for checkpoints)."""
    old = {k: v for k, v in to_dict(ModelConfig()).items() if k != "hyper_rank"}
    assert from_dict(ModelConfig, old) == ModelConfig()
