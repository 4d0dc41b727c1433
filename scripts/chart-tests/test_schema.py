"""values.schema.json: a valid JSON Schema that declares every value of
values.yaml, accepts the defaults and every ci file, and makes Helm refuse bad
values (Helm's own validation, as at install time)."""

from __future__ import annotations

import json
import unittest
from typing import Any

import jsonschema
import yaml

import chartlib as cl

SCHEMA = json.loads((cl.CHART_DIR / "values.schema.json").read_text())
DEFAULTS = yaml.safe_load((cl.CHART_DIR / "values.yaml").read_text())

# (description, values, text the error must contain)
BAD_VALUES: list[tuple[str, dict[str, Any], str]] = [
    ("replicas as a word", {"replicaCount": "two"}, "replicaCount"),
    ("zero replicas", {"replicaCount": 0}, "replicaCount"),
    ("unknown certificate mode", {"certs": {"mode": "bogus"}}, "mode"),
    ("unknown top-level key", {"replicas": 2}, "replicas"),
    ("unknown nested key", {"config": {"modee": "retry"}}, "modee"),
    ("unknown denial mode", {"config": {"mode": "wait"}}, "mode"),
    ("a trusted peer that is a name", {"config": {"trustedPeers": ["apiserver.example"]}}, "trustedPeers"),
    ("duration in words", {"config": {"shutdownGrace": "20 seconds"}}, "shutdownGrace"),
    ("webhook timeout over 30s", {"webhooks": {"timeoutSeconds": 60}}, "timeoutSeconds"),
    ("failure policy typo", {"webhooks": {"collisionGuard": {"failurePolicy": "ignore"}}}, "failurePolicy"),
    ("webhook enabled as a string", {"webhooks": {"deletionAudit": {"enabled": "yes"}}}, "enabled"),
    ("tagger enabled as a word other than auto", {"webhooks": {"disruptionTagger": {"enabled": "yes"}}}, "enabled"),
    ("pull policy", {"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
    ("digest without algorithm", {"image": {"digest": "abc"}}, "digest"),
    ("existingSecret without a name", {"certs": {"mode": "existingSecret"}}, "name"),
    ("caBundle not base64", {"certs": {"existingSecret": {"caBundle": "-----BEGIN"}}}, "caBundle"),
    ("service account not created and not named", {"serviceAccount": {"create": False}}, "name"),
    ("anti-affinity preset", {"podAntiAffinityPreset": "strict"}, "podAntiAffinityPreset"),
    ("an image platform graceguard is not built for", {"image": {"platforms": ["linux/s390x"]}}, "platforms"),
    ("PDB minAvailable as words", {"podDisruptionBudget": {"minAvailable": "half"}}, "minAvailable"),
    ("service type", {"service": {"type": "ExternalName"}}, "type"),
    ("port out of range", {"service": {"port": 70000}}, "port"),
    ("image pull secret as a string", {"imagePullSecrets": ["regcred"]}, "imagePullSecrets"),
    ("pod annotation value not a string", {"podAnnotations": {"a": 1}}, "podAnnotations"),
    ("namespace name with capitals", {"webhooks": {"excludeNamespaces": ["Kube-System"]}}, "excludeNamespaces"),
    ("issuerRef kind without name", {"certs": {"certManager": {"issuerRef": {"kind": "ClusterIssuer"}}}}, "name"),
]


def declared(schema: dict[str, Any], path: list[str]) -> bool:
    """Whether the schema declares the value at `path` (a key of a free-form
    object, such as resources or affinity, is declared by that object)."""
    node = schema
    for key in path:
        if node.get("type") == "object" and "properties" not in node and node.get("additionalProperties") is not False:
            return True
        props = node.get("properties") or {}
        if key not in props:
            return False
        node = props[key]
    return True


def leaves(value: Any, path: list[str]) -> list[list[str]]:
    if isinstance(value, dict) and value:
        out: list[list[str]] = []
        for k, v in value.items():
            out += leaves(v, path + [k])
        return out
    return [path]


class TestSchema(unittest.TestCase):
    def test_is_a_valid_draft7_schema(self) -> None:
        jsonschema.Draft7Validator.check_schema(SCHEMA)
        self.assertIs(SCHEMA["additionalProperties"], False)

    def test_declares_every_value(self) -> None:
        missing = [".".join(p) for p in leaves(DEFAULTS, []) if not declared(SCHEMA, p)]
        self.assertEqual(missing, [])
        self.assertEqual(set(SCHEMA["properties"]) - {"global"}, set(DEFAULTS))

    def test_every_value_has_a_type_or_enum(self) -> None:
        def walk(node: dict[str, Any], where: str) -> list[str]:
            bad = [] if any(k in node for k in ("type", "enum", "oneOf", "const")) else [where]
            for k, child in (node.get("properties") or {}).items():
                bad += walk(child, f"{where}.{k}")
            return bad
        self.assertEqual(walk(SCHEMA, "values"), [])

    def test_defaults_and_ci_files_pass(self) -> None:
        jsonschema.Draft7Validator(SCHEMA).validate(cl.merge_values({}))
        cl.validate_schema({})
        for path in cl.ci_values_files():
            with self.subTest(path.name):
                values = cl.load_values(path)
                cl.validate_schema(values)
                jsonschema.Draft7Validator(SCHEMA).validate(cl.merge_values(values))

    def test_helm_rejects_bad_values(self) -> None:
        for what, values, needle in BAD_VALUES:
            with self.subTest(what):
                with self.assertRaises(cl.HelmValuesError, msg=f"{what}: {values} was accepted") as ctx:
                    cl.validate_schema(values)
                self.assertIn(needle, str(ctx.exception))
                # The same values make the render (helm template / install) fail too.
                with self.assertRaises(cl.HelmError, msg=f"{what}: render accepted {values}"):
                    cl.render(values)


if __name__ == "__main__":
    unittest.main()
