"""A fake Kubernetes API server over HTTP: the real `kubernetes` client talks to it unmodified.

Implements what gpuheal uses, with real semantics: nodes, pods, events, namespaces and
PodDisruptionBudgets; uid, creationTimestamp and a global resourceVersion with 409 on stale
writes; strategic-merge, JSON merge and JSON patches; the status subresources; label and field
selectors; the Eviction subresource (201, or 429 when a budget would be broken); watch from a
resourceVersion. Hooks inject errors and latency, flip nodes NotReady, and record every eviction.
"""

from sim.fake_kube.errors import ApiError
from sim.fake_kube.hooks import InjectedFault
from sim.fake_kube.http import FakeKubeServer
from sim.fake_kube.store import EvictionRecord, FakeKube

__all__ = ["ApiError", "EvictionRecord", "FakeKube", "FakeKubeServer", "InjectedFault"]
