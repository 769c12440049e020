"""Choosing the heads to keep: CAHP's analysis of a model and the strategies that choose from it.

Reading order of one selection (``select_heads`` in ``_select_heads``): ``_sampling`` (sample order,
shards) -> ``_signatures`` (per-class attention statistics) -> ``_convergence`` (when to stop reading)
-> ``_separation`` (Jeffries-Matusita features) -> ``_graph_space`` (t-SNE) -> ``_sweep`` (FasterPAM
and MSS for every k) -> ``_knee`` (k*) -> ``_head_structure`` (those four stages in one call)
-> ``_salience`` (head importance) -> ``_analysis`` (``analyze_heads``) -> ``_strategies`` (``choose``,
by the names in ``cahp_engine._strategy_names``) -> ``_choice`` (the ``Selection`` rules) -> ``_stability``
-> ``_consensus`` (the consensus strategies' shared parts)."""

from ._analysis import HeadAnalysis, analyze_heads, validate_inputs
from ._choice import Selection, select_most_frequent, select_random, select_representatives, select_top_salience
from ._consensus import co_association, consensus_runs, kept_frequency, mean_graph_distance
from ._convergence import PLATEAU_GAIN, class_difference_noise, is_plateau, salience_noise
from ._graph_space import default_perplexity, embed_heads
from ._head_structure import head_structure
from ._knee import chord_knee, find_knee, knees_by_degree
from ._records import ConsensusRecord, SamplingRecord, StabilityRecord
from ._salience import gradient_salience, minmax
from ._sampling import ladder_sizes, resolve_amount, stratified_order
from ._select_heads import SelectionResult, select_heads
from ._separation import bhattacharyya_normal, jeffries_matusita, separation_features
from ._signatures import (
    ClassMoments,
    ShardedSignatures,
    SignatureProfiler,
    Signatures,
    crop_and_resize,
    default_resolution,
    extract_signatures,
    merge_moments,
)
from ._stability import jaccard, selection_stability
from ._strategies import choose, get_strategy
from ._sweep import cluster, mean_simplified_silhouette, mss_sweep

__all__ = [
    "ConsensusRecord", "SamplingRecord", "StabilityRecord",
    "PLATEAU_GAIN",
    "analyze_heads", "bhattacharyya_normal", "ladder_sizes",
    "choose", "chord_knee", "class_difference_noise", "ClassMoments", "cluster", "co_association",
    "consensus_runs", "crop_and_resize", "default_perplexity", "default_resolution", "embed_heads",
    "extract_signatures", "find_knee", "get_strategy", "gradient_salience", "head_structure", "HeadAnalysis",
    "is_plateau", "jaccard", "jeffries_matusita", "kept_frequency", "knees_by_degree", "mean_graph_distance",
    "mean_simplified_silhouette", "merge_moments", "minmax", "mss_sweep", "resolve_amount", "salience_noise",
    "select_heads", "select_most_frequent", "select_random", "select_representatives", "select_top_salience",
    "Selection",
    "selection_stability", "SelectionResult", "separation_features", "ShardedSignatures", "SignatureProfiler",
    "Signatures", "stratified_order", "validate_inputs",
]
