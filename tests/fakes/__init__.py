"""One in-memory fake per port of shared.kernel.ports, outside the product.

``aks.FakeAks`` (AksPort), ``kube.FakeKube`` (KubePort), ``compute.FakeCompute`` (ComputePort),
``events.RecordingEvents`` (EventsPort), ``ledger.InMemoryLedger`` (LedgerPort), ``nudge.RecordingNudger``
(NudgePort) and ``access.FakeAccess`` (ClusterAccess); ``faults`` and ``objects`` are their shared parts.
tests/unit/test_port_signatures.py holds each to its port's signatures. The job fakes of tests/unit
(fakes_remediation, fakes_migration, fakes_pool) build scenarios over them. The soak (``soak.inprocess``),
a test harness run from the repository root (``python -m soak``), uses them too, where ``tests`` is
importable as a namespace package. Nothing under ``shared/`` or ``functions/`` may import them.
"""
