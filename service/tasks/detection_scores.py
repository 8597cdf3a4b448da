"""How a set-prediction detector's class logits become scored detections: one rule per class, one registry.

A detector's manifest names its rule in ``task_options.scores`` (:class:`service.tasks.detection.DetectOptions`);
the detection task looks the rule up in :data:`RULES` and never compares a rule's or a model family's name.
Each rule reproduces the ``post_process_object_detection`` of the Hugging Face image processors of the
families trained with it (transformers 5.24), in numpy:

* :class:`SoftmaxNoObject` (``"softmax"``): DETR (Carion et al. 2020, Sec. 3.1 and its ``PostProcess``)
  and YOLOS (Fang et al. 2021, Sec. 2.1, DETR's set loss): a softmax over the classes plus the no-object
  class (last), which is then dropped; each query's best remaining class is its one detection.
* :class:`SigmoidTopK` (``"sigmoid_top_k"``): the detectors trained with a focal (sigmoid) class loss and
  no no-object class: Deformable DETR (Zhu et al. 2021, Sec. 4.1 and App. A.4), Conditional DETR (Meng et
  al. 2021, Sec. 3.4), RT-DETR v1/v2 (Zhao et al. 2024, Sec. 4.4; Lv et al. 2024), D-FINE (Peng et al.
  2024), LW-DETR (Chen et al. 2024) and RF-DETR (Robinson et al. 2025): a sigmoid per (query, class) and
  the ``top_k`` best (query, class) pairs over all queries x classes, so one query may yield several
  detections of different classes.

Adding a rule is one class here with a ``name``, ``no_object`` and ``select``, registered in :data:`RULES`.
"""

from __future__ import annotations

from typing import ClassVar, Protocol

import numpy as np

from service.imaging.postprocess import softmax


class ScoreRule(Protocol):
    """One way of reading a detector's class logits.

    Attributes:
        name: the manifest's ``task_options.scores``.
        no_object: the logits carry a no-object column last (it is no label of a detection).
        takes_top_k: ``task_options.top_k`` means something to this rule.
    """

    name: ClassVar[str]
    no_object: ClassVar[bool]
    takes_top_k: ClassVar[bool]

    def select(
        self, logits: np.ndarray, *, threshold: float, max_detections: int, top_k: int | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The kept detections of one image, best first.

        Args:
            logits: float (num_queries, num_columns) raw class scores of one image.
            threshold: the lowest score kept, in [0, 1].
            max_detections: the most detections returned, >= 1.
            top_k: the rule's candidate count (None: the rule's default).

        Returns:
            (queries, class_ids, scores), each (K,) with K <= max_detections: int64 query indices,
            int64 class indices (into the labels) and float32 scores in [0, 1], by score descending
            (ties: lower flat index first).
        """


class SoftmaxNoObject:
    """DETR's and YOLOS's rule: softmax over classes + no-object, no-object dropped, best class per query."""

    name: ClassVar[str] = "softmax"
    no_object: ClassVar[bool] = True
    takes_top_k: ClassVar[bool] = False

    def select(
        self, logits: np.ndarray, *, threshold: float, max_detections: int, top_k: int | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """See :meth:`ScoreRule.select`; ``top_k`` is unused (each query is one candidate)."""
        probabilities = softmax(logits)[:, :-1]  # (Q, num_classes): "no object" dropped
        class_ids = np.argmax(probabilities, axis=1)  # (Q,)
        scores = probabilities[np.arange(len(class_ids)), class_ids]  # (Q,)
        order = np.argsort(-scores, kind="stable")
        order = order[scores[order].astype(np.float64) >= threshold][:max_detections]  # as reported: float64
        return order, class_ids[order], scores[order]


class SigmoidTopK:
    """The focal-loss detectors' rule: sigmoid per (query, class), the ``top_k`` best pairs over Q x C.

    ``top_k`` None means ``num_queries`` (RT-DETR's and RF-DETR's processors); Deformable and
    Conditional DETR's processors (and LW-DETR, which uses Deformable DETR's) default to 100.
    """

    name: ClassVar[str] = "sigmoid_top_k"
    no_object: ClassVar[bool] = False
    takes_top_k: ClassVar[bool] = True

    def select(
        self, logits: np.ndarray, *, threshold: float, max_detections: int, top_k: int | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """See :meth:`ScoreRule.select`."""
        num_queries, num_classes = logits.shape
        probabilities = 1.0 / (1.0 + np.exp(-logits.astype(np.float32)))  # (Q, C)
        flat = probabilities.reshape(-1)  # (Q * C,), index q * C + c
        k = min(top_k if top_k is not None else num_queries, flat.size)
        order = np.argsort(-flat, kind="stable")[:k]
        order = order[flat[order].astype(np.float64) >= threshold][:max_detections]  # as reported: float64
        return order // num_classes, order % num_classes, flat[order]


RULES: dict[str, ScoreRule] = {rule.name: rule for rule in (SoftmaxNoObject(), SigmoidTopK())}
