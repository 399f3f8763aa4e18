"""No key, SAS or secret exists in the infrastructure, the settings files or anywhere in the repo.

The one exception is Azurite's public, well-known development key, which the local host needs to
talk to the emulator: it may appear only under devhost/ and tests/. Everything in Azure
authenticates with the app's managed identity, so nothing else key-shaped has a reason to exist.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from infra_facts import AZURITE_ACCOUNT_KEY, INFRA, REPO, bicep_files

AZURITE_ALLOWED_UNDER = ("devhost/", "tests/")

SKIPPED_DIRS = {".git", ".venv", ".tools", "node_modules", "__pycache__", ".pytest_cache", ".ruff_cache",
                ".hypothesis", ".state", ".mypy_cache"}
MAX_BYTES = 2_000_000

PATTERNS: dict[str, re.Pattern[str]] = {
    "storage account key in a connection string": re.compile(r"Account" r"Key=([A-Za-z0-9+/]{8,}={0,2})"),
    "shared access signature": re.compile(r"SharedAccess" r"Signature=[^;\s\"']+"),
    "shared access key (Service Bus / Event Hubs)": re.compile(r"SharedAccess" r"Key=[^;\s\"']+"),
    "SAS token signature in a URL": re.compile(r"[?&]sig=[A-Za-z0-9%+/]{16,}"),
    "base64 storage key": re.compile(r"(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{86}==(?![A-Za-z0-9+/=])"),
    "private key": re.compile(r"-----BEGIN (?:RSA |EC |OPENSSH |ENCRYPTED )?PRIVATE KEY-----\s*\n\s*[A-Za-z0-9+/=]{40,}"),
    "Event Grid access key": re.compile(r"aeg-sas-key\s*[\"']?\s*[:=]\s*[\"'][A-Za-z0-9+/]{32,}={0,2}[\"']"),
    "Event Grid SAS token": re.compile(r"aeg-sas-token\s*[\"']?\s*[:=]\s*[\"'][^\"']*\bs=[A-Za-z0-9%+/]{16,}"),
    "Application Insights instrumentation key": re.compile(r"Instrumentation" r"Key=[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-"),
}

BICEP_KEY_FUNCTIONS = re.compile(r"\b(?:listKeys|listAccountSas|listServiceSas|listConnectionStrings|listSecrets|"
                                 r"listCredentials|listAdminKeys|listQueryKeys)\s*\(", re.IGNORECASE)


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    kind: str
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.kind}: {self.text}"


def repo_text_files(root: Path) -> list[Path]:
    files = []
    for path in root.rglob("*"):
        relative = path.relative_to(root)
        if any(part in SKIPPED_DIRS for part in relative.parts) or not path.is_file():
            continue
        if path.stat().st_size > MAX_BYTES:
            continue
        files.append(path)
    return sorted(files)


def _azurite_allowed(relative: str, value: str) -> bool:
    return value == AZURITE_ACCOUNT_KEY and relative.startswith(AZURITE_ALLOWED_UNDER)


def text_files(root: Path) -> dict[str, str]:
    """Relative path -> text of every text file under ``root`` (binary files left out)."""
    out = {}
    for path in repo_text_files(root):
        try:
            out[path.relative_to(root).as_posix()] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
    return out


@functools.cache
def repository_texts() -> dict[str, str]:
    return text_files(REPO)


def scan(root: Path) -> list[Finding]:
    """Every key-shaped string under ``root`` (the Azurite key under devhost/ and tests/ excepted)."""
    return scan_texts(repository_texts() if root == REPO else text_files(root))


def scan_texts(texts: dict[str, str]) -> list[Finding]:
    findings = []
    for relative, text in texts.items():
        for kind, pattern in PATTERNS.items():
            for match in pattern.finditer(text):
                value = match.group(1) if match.groups() else match.group(0)
                if _azurite_allowed(relative, value):
                    continue
                line = text.count("\n", 0, match.start()) + 1
                findings.append(Finding(relative, line, kind, match.group(0)[:60]))
    return findings


def test_no_key_sas_or_secret_exists_anywhere_in_the_repository() -> None:
    findings = scan(REPO)
    assert not findings, "secrets or key-shaped strings found:\n" + "\n".join(map(str, findings))


def test_the_azurite_key_appears_only_in_the_local_host_and_tests() -> None:
    for relative, text in repository_texts().items():
        if AZURITE_ACCOUNT_KEY in text:
            assert relative.startswith(AZURITE_ALLOWED_UNDER), f"{relative} holds the Azurite key"


@pytest.mark.parametrize(
    ("relative", "content", "kind"),
    [
        ("infra/x.bicep", "var c = 'DefaultEndpointsProtocol=https;AccountName=a;Account" "Key=c2VjcmV0LWtleQ=='",
         "storage account key in a connection string"),
        ("devhost/x.py", "CONN = 'AccountName=devstoreaccount1;AccountKey=" + "A" * 86 + "=='",
         "storage account key in a connection string"),
        ("shared/x.py", f"KEY = '{AZURITE_ACCOUNT_KEY}'", "base64 storage key"),
        ("infra/y.json", '{"url": "https://a.blob.core.windows.net/c?sv=2024&' 'sig=abcdefghijklmnopqrstuv"}',
         "SAS token signature in a URL"),
        ("docs/z.md", "Endpoint=sb://x/;SharedAccessKeyName=k;SharedAccess" "Key=abc123abc123",
         "shared access key (Service Bus / Event Hubs)"),
        ("local.settings.example.json", '{"APPLICATIONINSIGHTS_CONNECTION_STRING": '
         '"Instrumentation' 'Key=12345678-1234-1234-1234-123456789012"}', "Application Insights instrumentation key"),
        ("sim/x.py", "headers = {'aeg-sas-" "key': '" + "k" * 43 + "='}", "Event Grid access key"),
        ("devhost/y.py", "headers = {'aeg-sas-" "token': 'r=https%3a%2f%2fx&e=1&s=" + "Q" * 43 + "'}",
         "Event Grid SAS token"),
    ],
    ids=["a key in Bicep", "a made-up key in the local host", "the Azurite key outside devhost and tests",
         "a SAS URL", "a Service Bus key in the docs", "a real instrumentation key in the settings",
         "an Event Grid key", "an Event Grid SAS token"],
)
def test_the_scanner_finds_a_planted_secret(tmp_path: Path, relative: str, content: str, kind: str) -> None:
    target = tmp_path / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content + "\n", encoding="utf-8")
    assert kind in {f.kind for f in scan(tmp_path)}


def test_the_scanner_lets_the_azurite_key_through_in_the_local_host(tmp_path: Path) -> None:
    (tmp_path / "devhost").mkdir()
    (tmp_path / "devhost" / "azurite.py").write_text(
        f'KEY = "{AZURITE_ACCOUNT_KEY}"\nCONN = "AccountName=devstoreaccount1;AccountKey={AZURITE_ACCOUNT_KEY};"\n',
        encoding="utf-8")
    assert scan(tmp_path) == []


@pytest.mark.parametrize("path", bicep_files(), ids=[str(p.relative_to(INFRA)) for p in bicep_files()])
def test_no_bicep_file_reads_a_key_or_takes_a_secret_parameter(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert not BICEP_KEY_FUNCTIONS.search(text), f"{path.name} reads keys: {BICEP_KEY_FUNCTIONS.search(text)}"
    assert "@secure()" not in text, f"{path.name} takes a secret parameter; nothing here should need one"


def test_the_settings_files_hold_no_storage_connection_string_with_a_key() -> None:
    for name in ("local.settings.example.json", "infra/main.parameters.json"):
        path = REPO / name
        if path.exists():
            text = path.read_text(encoding="utf-8")
            assert "AccountKey=" not in text, f"{name} holds a storage key"
            assert "SharedAccessSignature" not in text, f"{name} holds a SAS"
