import pytest

from cahp_engine.config import PruningConfig
from cahp_engine.errors import ConfigError


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"poly_degree": 0}, "`poly_degree` must be an integer between 1 and 10, got 0"),
        ({"poly_degree": 2.5}, "`poly_degree` must be an integer"),
        ({"resolution": 1}, "`resolution` must be an integer between 2 and 512, got 1"),
        ({"calibration_fraction": 1.5}, r"`calibration_fraction` must be a number in \(0.0, 1.0\], got 1.5"),
        ({"calibration_fraction": 0}, "`calibration_fraction`"),
        ({"signature_samples": 1}, "`signature_samples` must be an integer >= 2, got 1"),
        ({"signature_samples": 1.5}, "`signature_samples`"),
        ({"signature_samples": "some"}, "`signature_samples` must be an integer count >= 2, a fraction in "
         r"\(0, 1\], 'all' or 'auto', got 'some'"),
        ({"signature_samples": None}, "`signature_samples`"),
        ({"calibration_fraction": "all"}, r"`calibration_fraction` must be a number in \(0.0, 1.0\] or 'auto'"),
        ({"stability_shards": 1}, "`stability_shards` must be 0 \\(off\\) or an integer between 2 and 20, got 1"),
        ({"stability_shards": 21}, "`stability_shards`"),
        ({"strategy": "magnitude"}, "`strategy` must be one of cahp, salience, random, coassociation, "
                                    "stability-selection, mean-distance, cahp-layer-salience, got 'magnitude'"),
        ({"epochs": -1}, "`epochs` must be a number in"),
        ({"lr": 0}, "`lr`"),
        ({"heads_to_keep": 0}, "`heads_to_keep` must be an integer >= 1, got 0"),
        ({"dense_finetune": "sometimes"}, "`dense_finetune` must be one of auto, always, never"),
        ({"device": "tpu"}, "`device` must be auto, cpu, cuda or cuda:N"),
        ({"batch_size": True}, "`batch_size` must be an integer"),
        ({"seed": -3}, "`seed`"),
        ({"calibration_fraction": float("nan")}, "`calibration_fraction`"),
        ({"signature_samples": 1.5}, r"^`signature_samples` must be a number in \(0.0, 1.0\], got 1.5$"),
        ({"max_length": 1}, "^`max_length` must be an integer between 2 and 8192, got 1$"),
        ({"warmup_ratio": 1.5}, r"^`warmup_ratio` must be a number in \[0.0, 1.0\], got 1.5$"),
        ({"reported_degrees": (0, 2)}, r"^`reported_degrees` must be a non-empty tuple of integers between 1 and 10, "
         r"got \(0, 2\)$"),
        ({"reported_degrees": ()}, "`reported_degrees` must be a non-empty tuple"),
        # Rules over two settings are checked after each one's own.
        ({"max_accuracy_drop": 1.0, "heads_to_keep": 3}, "`heads_to_keep` fixes it; set one of them"),
        ({"quantize": "int8", "export": "none"}, "`quantize` 'int8' quantizes the ONNX export"),
    ],
)
def test_out_of_range_values_say_what_to_change(changes, message):
    with pytest.raises(ConfigError, match=message):
        PruningConfig(**changes)


def test_defaults_follow_the_paper_and_round_trip():
    config = PruningConfig()
    assert (config.poly_degree, config.calibration_fraction, config.batch_size) == (2, "auto", 32)
    assert (config.signature_samples, config.perplexity, config.var_floor, config.stability_shards) == (
        "auto", None, 1e-6, 5)
    for amount in ("all", 1.0, 0.5, 2000):
        assert PruningConfig(signature_samples=amount).signature_samples == amount
    assert (config.epochs, config.lr, config.warmup_ratio, config.weight_decay, config.max_grad_norm) == (
        3, 2e-5, 0.1, 0.01, 1.0)
    assert PruningConfig.from_dict(config.to_dict()) == config
    assert config.replace(device="cuda:1").device == "cuda:1"
    with pytest.raises(ConfigError, match="unknown setting"):
        PruningConfig.from_dict({"poly_degre": 3})
