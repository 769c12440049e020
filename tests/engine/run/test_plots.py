"""The run's figures: real PNG files that matplotlib reads back, drawn without touching pyplot."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from cahp_engine.errors import InvalidInputError
from cahp_engine.run import HeadMap, MssPlot, plot_head_map, plot_layer_retention, plot_mss_curve

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
DPI = 110
KEPT_RGB = np.array([0x2B, 0x83, 0xBA]) / 255


def read_png(path: Path) -> np.ndarray:
    assert path.read_bytes()[:8] == PNG_MAGIC
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[2] in (3, 4)
    assert image[..., :3].std() > 0.05, "the image is (nearly) blank"
    return image


def assert_size(image: np.ndarray, width_in: float, height_in: float) -> None:
    height, width = image.shape[:2]
    assert abs(width - width_in * DPI) <= 2 and abs(height - height_in * DPI) <= 2, (width, height)


def kept_pixels(image: np.ndarray) -> int:
    return int((np.abs(image[..., :3] - KEPT_RGB).max(axis=-1) < 0.02).sum())


def mss_curve(n: int = 40) -> tuple[np.ndarray, np.ndarray]:
    ks = np.arange(2, n + 2)
    return ks, 1 - np.exp(-ks / 8)


# --- MSS curve ----------------------------------------------------------------------------------------


def test_mss_curve_writes_a_png(tmp_path: Path) -> None:
    ks, mss = mss_curve()
    path = tmp_path / "mss.png"
    plot_mss_curve(MssPlot(ks, mss, {2: 12, 3: 10, 4: None, 5: 9, 6: 9}, 12, chosen_degree=2, title="run 7"), path)
    assert_size(read_png(path), 7.5, 4.6)


def test_mss_curve_without_any_knee_or_degree(tmp_path: Path) -> None:
    ks, mss = mss_curve(5)
    plot_mss_curve(MssPlot(list(ks), list(mss), {2: None, 3: None}, 3), tmp_path / "a.png")
    plot_mss_curve(MssPlot([2], [0.5], {}, 2), str(tmp_path / "b.png"))
    for name in ("a.png", "b.png"):
        read_png(tmp_path / name)


@pytest.mark.parametrize(("ks", "mss"), [([2, 3], [0.1]), ([], []), ([[2, 3]], [[0.1, 0.2]])])
def test_mss_curve_rejects_mismatched_input(tmp_path: Path, ks: list[int], mss: list[float]) -> None:
    with pytest.raises(InvalidInputError, match="`ks` and `mss` must be 1-D"):
        plot_mss_curve(MssPlot(ks, mss, {}, 2), tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


# --- head map -----------------------------------------------------------------------------------------


def head_grid(layers: int, heads: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    kept = rng.random((layers, heads)) < 0.3
    salience = rng.random((layers, heads))
    cluster = rng.integers(0, max(2, layers * heads // 3), size=(layers, heads))
    return kept, salience, cluster


def test_head_map_writes_a_png(tmp_path: Path) -> None:
    kept, salience, cluster = head_grid(12, 12)
    kept[0] = False
    kept[0, 3] = True
    reps = [tuple(map(int, h)) for h in np.argwhere(kept)][1:]
    path = tmp_path / "map.png"
    plot_head_map(HeadMap(kept, salience, cluster, representatives=reps, layer_safety_added=[(0, 3)]), path)
    image = read_png(path)
    assert_size(image, 3 * 12 * 0.34 + 2.6, 12 * 0.34 + 1.9)
    assert kept_pixels(image) > 0


def test_head_map_adds_a_stability_panel(tmp_path: Path) -> None:
    kept, salience, cluster = head_grid(6, 12)
    frequency = np.linspace(0, 1, 72).reshape(6, 12)
    path = tmp_path / "map.png"
    plot_head_map(HeadMap(kept, salience, cluster, kept_frequency=frequency, stability_title="kept in 5 runs"), path)
    assert_size(read_png(path), 4 * 12 * 0.34 + 3.8, 6 * 0.34 + 1.9)
    with pytest.raises(InvalidInputError, match="`kept_frequency` must have the shape"):
        plot_head_map(HeadMap(kept, salience, cluster, kept_frequency=np.zeros((2, 2))), path)


def test_head_map_adds_a_consensus_panel_after_the_stability_one(tmp_path: Path) -> None:
    kept, salience, cluster = head_grid(6, 12)
    frequency = np.linspace(0, 1, 72).reshape(6, 12)
    path = tmp_path / "map.png"
    plot_head_map(HeadMap(kept, salience, cluster, kept_frequency=frequency, consensus_frequency=frequency[::-1],
                          consensus_title="coassociation: kept by CAHP in 6 runs"), path)
    assert_size(read_png(path), 5 * 12 * 0.34 + 5.0, 6 * 0.34 + 1.9)
    plot_head_map(HeadMap(kept, salience, cluster, consensus_frequency=frequency), path)
    assert_size(read_png(path), 4 * 12 * 0.34 + 3.8, 6 * 0.34 + 1.9)
    with pytest.raises(InvalidInputError, match="`consensus_frequency` must have the shape"):
        plot_head_map(HeadMap(kept, salience, cluster, consensus_frequency=np.zeros((2, 2))), path)


def test_head_map_shows_how_many_heads_are_kept(tmp_path: Path) -> None:
    _, salience, cluster = head_grid(6, 6)
    few = np.zeros((6, 6), dtype=bool)
    few[2, 2] = True
    plot_head_map(HeadMap(few, salience, cluster), tmp_path / "few.png")
    plot_head_map(HeadMap(np.ones((6, 6), dtype=bool), salience, cluster), tmp_path / "all.png")
    assert kept_pixels(read_png(tmp_path / "all.png")) > 10 * kept_pixels(read_png(tmp_path / "few.png"))


def test_head_map_single_layer_and_flat_cluster_ids(tmp_path: Path) -> None:
    path = tmp_path / "one.png"
    plot_head_map(HeadMap(np.ones((1, 4), dtype=int), np.full((1, 4), 0.5), np.arange(4), representatives=[(0, 1)]),
                  path)
    read_png(path)


def test_head_map_of_a_grid_too_large_for_cell_labels(tmp_path: Path) -> None:
    kept, salience, cluster = head_grid(24, 20)
    path = tmp_path / "large.png"
    plot_head_map(HeadMap(kept, salience, cluster.ravel()), path)
    assert_size(read_png(path), 3 * 20 * 0.34 + 2.6, 24 * 0.34 + 1.9)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"salience": np.zeros((3, 5))}, "`salience` must have the shape of `kept`"),
        ({"cluster": np.zeros(11, dtype=int)}, r"`cluster` must have shape \(3, 4\) or \(12,\)"),
        ({"kept": np.full((3, 4), 2)}, "`kept` must hold booleans"),
        ({"kept": np.ones(12, dtype=bool)}, "`kept` must be a non-empty \\(layers, heads\\) array"),
        ({"representatives": [(3, 0)]}, r"`representatives` holds heads \[\(3, 0\)\] outside the 3 x 4 grid"),
        ({"layer_safety_added": [(0, -1)]}, "`layer_safety_added` holds heads"),
    ],
)
def test_head_map_rejects_bad_input(tmp_path: Path, change: dict[str, object], message: str) -> None:
    kept, salience, cluster = head_grid(3, 4)
    args: dict[str, object] = {"kept": kept, "salience": salience, "cluster": cluster, **change}
    with pytest.raises(InvalidInputError, match=message):
        plot_head_map(HeadMap(**args), tmp_path / "x.png")  # type: ignore[arg-type]


# --- retention per layer ------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(12, 12), (1, 6), (24, 16)])
def test_layer_retention_writes_a_png(tmp_path: Path, shape: tuple[int, int]) -> None:
    kept, _, _ = head_grid(*shape)
    path = tmp_path / "retention.png"
    plot_layer_retention(kept, path)
    assert_size(read_png(path), max(4.5, 0.42 * shape[0] + 2.0), 3.8)


def test_layer_retention_with_every_head_kept_or_a_layer_empty(tmp_path: Path) -> None:
    plot_layer_retention(np.ones((4, 4), dtype=bool), tmp_path / "all.png")
    empty = np.ones((4, 4), dtype=bool)
    empty[1] = False
    plot_layer_retention(empty, tmp_path / "gap.png")
    full, gap = read_png(tmp_path / "all.png"), read_png(tmp_path / "gap.png")
    assert kept_pixels(full) > kept_pixels(gap) > 0


# --- the global backend -------------------------------------------------------------------------------


def test_plotting_leaves_the_global_backend_and_pyplot_alone(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        import matplotlib
        matplotlib.use("svg")  # a caller's own choice, which the engine must keep
        import numpy as np
        from cahp_engine.run import _plots as plots
        kept = np.eye(3, dtype=bool)
        plots.plot_mss_curve(plots.MssPlot([2, 3, 4], [0.1, 0.5, 0.6], {{2: 3, 3: None}}, 3), r"{tmp_path}/m.png")
        plots.plot_head_map(plots.HeadMap(kept, np.ones((3, 3)), np.arange(9)), r"{tmp_path}/h.png")
        plots.plot_layer_retention(kept, r"{tmp_path}/r.png")
        assert matplotlib.get_backend() == "svg", matplotlib.get_backend()
        assert "matplotlib.pyplot" not in sys.modules
        print("ok")
        """
    )
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    for name in ("m.png", "h.png", "r.png"):
        read_png(tmp_path / name)
