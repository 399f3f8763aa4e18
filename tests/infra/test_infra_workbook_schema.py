"""The deployed workbook is valid against Azure Workbooks' published JSON schema.

infra/monitoring/workbook.json is the serializedData of the workbook infra/app/operator-monitoring.bicep
deploys. It is validated with the jsonschema package against schema/workbook.json of
https://github.com/microsoft/Application-Insights-Workbooks, kept byte for byte in tests/infra/workbook_schema/
(its README.md names the commit, the git blob and the MIT licence). Nothing is fetched: the schema's $refs all
point inside the file, and the validator is given a registry that holds only that file and retrieves nothing.

The schema is loose: it allows any property it does not name, and it gives the versions ("Notebook/1.0",
"KqlItem/1.0") only as defaults. So the versions are compared with those defaults separately, and copies of the
workbook broken on purpose show that the validator rejects, for the expected reason, what the schema forbids.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # jsonschema ships no type hints (no py.typed)
import pytest
from referencing import Registry, Resource
from referencing.exceptions import Unresolvable

REPO = Path(__file__).resolve().parents[2]
WORKBOOK = REPO / "infra" / "monitoring" / "workbook.json"
FIXTURE = Path(__file__).resolve().parent / "workbook_schema"
SCHEMA = FIXTURE / "workbook.schema.json"


@functools.cache
def schema_text() -> bytes:
    return SCHEMA.read_bytes()


def schema() -> dict[str, Any]:
    return json.loads(schema_text())  # a fresh copy each time: the tests cannot change each other's


def workbook() -> dict[str, Any]:
    return json.loads(WORKBOOK.read_text(encoding="utf-8"))


def validator_of(document_schema: dict[str, Any]) -> Any:
    """The validator of the schema's own dialect, resolving $refs only inside the schema: a Registry made
    here retrieves nothing (unlike jsonschema's default one, which would download an unknown URI)."""
    cls = jsonschema.validators.validator_for(document_schema)
    resource = Resource.from_contents(document_schema)
    registry: Registry[Any] = Registry().with_resource(document_schema.get("$id", ""), resource)
    return cls(document_schema, registry=registry)


@functools.cache
def validator() -> Any:
    return validator_of(schema())


def errors(document: dict[str, Any]) -> list[Any]:
    return sorted(validator().iter_errors(document), key=lambda error: error.json_path)


def described(found: list[Any]) -> list[str]:
    return [f"{error.json_path}: {error.message}" for error in found]


def step_types() -> list[tuple[str, int]]:
    """(definition, step type) of each step the schema accepts in ``items``, in the order of its anyOf."""
    definitions = schema()["definitions"]
    out = []
    for choice in definitions["items"]["items"]["anyOf"]:
        name = choice["$ref"].removeprefix("#/definitions/")
        out.append((name, definitions[name]["properties"]["type"]["const"]))
    return out


def why_each_step_type_refused(error: Any) -> dict[int, list[str]]:
    """For an item that none of the step types accepted (an anyOf error): step type -> that type's reasons."""
    assert error.validator == "anyOf", error.message
    types = [step_type for _, step_type in step_types()]
    reasons: dict[int, list[str]] = defaultdict(list)
    for sub in error.context:
        where = ".".join(str(part) for part in sub.relative_path)
        reasons[types[sub.relative_schema_path[0]]].append(f"{where}: {sub.message}" if where else sub.message)
    return dict(reasons)


def steps(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every step of the workbook, the steps inside groups too."""
    for item in items:
        yield item
        yield from steps(item.get("content", {}).get("items", []))


# The copy of the schema


def test_the_schema_copy_is_the_upstream_file_its_readme_names() -> None:
    readme = (FIXTURE / "README.md").read_text(encoding="utf-8")
    assert "github.com/microsoft/Application-Insights-Workbooks" in readme and "`schema/workbook.json`" in readme
    assert "Licence: MIT" in readme and "Permission is hereby granted, free of charge" in readme
    [blob] = re.findall(r"Git blob: `([0-9a-f]{40})`", readme)
    data = schema_text()
    assert hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == blob, (
        "tests/infra/workbook_schema/workbook.schema.json is no longer the upstream file its README names")


def test_the_schema_is_a_valid_draft_07_schema_and_is_validated_as_draft_07() -> None:
    assert schema()["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert type(validator()) is jsonschema.Draft7Validator
    jsonschema.Draft7Validator.check_schema(schema())


def test_a_reference_outside_the_copied_schema_is_refused_not_fetched() -> None:
    elsewhere = validator_of({"$schema": "http://json-schema.org/draft-07/schema#",
                              "$ref": "https://example.invalid/schema/other.json"})
    with pytest.raises(Unresolvable):
        elsewhere.validate({})


# Our workbook, held to the schema


def test_the_workbook_is_valid_against_azure_workbooks_published_schema() -> None:
    assert described(errors(workbook())) == []


def test_the_workbook_names_the_schema_it_is_validated_against() -> None:
    assert workbook()["$schema"] == schema()["$id"] == schema()["properties"]["$schema"]["default"]


def test_the_workbook_version_is_the_one_the_schema_gives() -> None:
    expected = schema()["properties"]["version"]["default"]
    assert expected == "Notebook/1.0"
    assert workbook()["version"] == expected


def test_every_step_version_is_the_one_the_schema_gives_for_its_type() -> None:
    definitions = schema()["definitions"]
    by_type = dict((step_type, name) for name, step_type in step_types())
    for step in steps(workbook()["items"]):
        version = definitions[by_type[step["type"]]]["properties"]["content"]["properties"].get("version")
        if version is not None and "version" in step["content"]:
            assert step["content"]["version"] == version["default"], step.get("name")
    assert {step["content"].get("version") for step in steps(workbook()["items"]) if step["type"] == 3} == {"KqlItem/1.0"}


# The validator rejects what the schema forbids, for the reason expected


def first_query(document: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return next((index, item) for index, item in enumerate(document["items"]) if item["type"] == 3)


def test_a_step_of_an_unknown_type_is_rejected_because_it_is_none_of_the_known_types() -> None:
    broken = workbook()
    broken["items"].append({"type": 99, "content": {"json": "a step no workbook knows"}, "name": "unknown"})
    [error] = errors(broken)
    assert error.json_path == f"$.items[{len(broken['items']) - 1}]"
    reasons = why_each_step_type_refused(error)
    assert sorted(reasons) == [1, 3, 9, 10, 11, 12]
    assert all(f"type: {step_type} was expected" in why for step_type, why in reasons.items()), reasons


def test_a_query_step_without_content_is_rejected_because_content_is_required() -> None:
    broken = workbook()
    index, query = first_query(broken)
    del query["content"]
    [error] = errors(broken)
    assert error.json_path == f"$.items[{index}]"
    assert why_each_step_type_refused(error)[3] == ["'content' is a required property"]


def test_a_query_step_whose_query_is_not_text_is_rejected_because_the_query_must_be_a_string() -> None:
    broken = workbook()
    index, query = first_query(broken)
    query["content"]["query"] = query["content"]["query"].splitlines()
    [error] = errors(broken)
    assert error.json_path == f"$.items[{index}]"
    [why] = why_each_step_type_refused(error)[3]
    assert why.startswith("content.query: ") and why.endswith("is not of type 'string'")


def test_a_workbook_without_a_version_is_rejected_because_the_version_is_required() -> None:
    broken = workbook()
    del broken["version"]
    assert described(errors(broken)) == ["$: 'version' is a required property"]
