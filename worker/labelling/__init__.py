"""The Labeller, the one door to the models: every front door (Kafka, HTTP, files) hands it reviews and gets
predictions back, each naming the model that made them.

Modules: `labeller` (the door: `Labeller.label(reviews) -> Future[Predictions]`; the served models by role),
`served_model` (one model with its engine: the one place an engine is built), `loading` (a model loaded as the
settings say), `in_order` (items labelled and collected in submission order, bounded).
"""

from worker.labelling.in_order import InOrder
from worker.labelling.labeller import Labeller, OptionsFor, Predictions
from worker.labelling.loading import LoadedModel, device_name, load_classifier_for, load_model
from worker.labelling.served_model import ServedModel

__all__ = [
    "InOrder",
    "Labeller",
    "LoadedModel",
    "OptionsFor",
    "Predictions",
    "ServedModel",
    "device_name",
    "load_classifier_for",
    "load_model",
]
