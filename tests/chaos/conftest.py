"""The chaos tests use the real-cluster fixture of tests/cluster (one definition)."""

from tests.cluster.conftest import cluster  # noqa: F401 - re-exported as a fixture
