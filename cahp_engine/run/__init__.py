"""A whole pruning run: the steps in order, the accuracy budget, the typed report, plots and artifacts.

Reading order: ``_request`` and ``_hooks`` (``RunRequest``, ``RunHooks``: what a run is asked, what it
reports back) -> ``_run`` (``run_pruning``: the stages in order) -> ``_steps`` (load, dense fine-tune,
select, prune, recover, evaluate) -> ``_holdout`` (the validation split recovery judges on) ->
``_candidates`` (one candidate of an accuracy budget, recovered) -> ``_budget`` (the budget's search
instead of a knee) -> ``_deploy`` (ONNX, int8, cards) -> ``_artifacts`` and ``_plots`` (the files) ->
``_records`` (the report's records from what the run did) -> ``_report`` (``RunReport``, what
``report.json`` holds).

The public names are declared in ``__init__.pyi`` and loaded on first use (SPEC 1 lazy loading), so
importing one name does not import the whole room."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
