"""Training a classifier, dense or pruned, and measuring it: fine-tuning, distillation, evaluation.

Reading order: ``_distillation`` (the teacher's logits and loss) -> ``_recipe`` -> ``_best`` -> ``_training``
(``FineTuning``, ``finetune``) -> ``_evaluation`` (accuracy, size, speed) -> ``_bootstrap`` -> ``_reconstruction``.

The public names are declared in ``__init__.pyi`` and loaded on first use (SPEC 1 lazy loading), so
importing one name does not import the whole room."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
