"""Structural schemas for the custom resources nodegate ships, for CI.

kubernetes-validate knows only built-in kinds. These schemas cover the fields
nodegate's components use, as the cert-manager v1 and monitoring.coreos.com/v1
API references define them (types, enums, required fields); every object is
closed (`additionalProperties: false`), so a misspelt field fails. They are
not the full CRDs.
"""
import json
import sys

import jsonschema
import yaml

S = {"type": "string"}
DURATION = {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"}
LABELS = {"type": "object", "additionalProperties": S}


def obj(props, required=()):
    return {"type": "object", "properties": props, "required": list(required),
            "additionalProperties": False}


def arr(items):
    return {"type": "array", "items": items}


METADATA = obj({"name": S, "namespace": S, "labels": LABELS, "annotations": LABELS},
               ["name", "namespace"])
ISSUER_REF = obj({"name": S, "kind": {"enum": ["Issuer", "ClusterIssuer"]}, "group": S}, ["name"])

SCHEMAS = {
    ("cert-manager.io/v1", "Issuer"): obj({
        "apiVersion": S, "kind": S, "metadata": METADATA,
        "spec": {"type": "object", "additionalProperties": False, "minProperties": 1, "maxProperties": 1,
                 "properties": {"selfSigned": obj({"crlDistributionPoints": arr(S)}),
                                "ca": obj({"secretName": S, "crlDistributionPoints": arr(S),
                                           "ocspServers": arr(S)}, ["secretName"])}},
    }, ["apiVersion", "kind", "metadata", "spec"]),
    ("cert-manager.io/v1", "Certificate"): obj({
        "apiVersion": S, "kind": S, "metadata": METADATA,
        "spec": obj({
            "secretName": S, "commonName": S, "dnsNames": arr(S), "isCA": {"type": "boolean"},
            "duration": DURATION, "renewBefore": DURATION, "issuerRef": ISSUER_REF,
            "usages": arr({"enum": ["signing", "digital signature", "content commitment",
                                    "key encipherment", "key agreement", "data encipherment",
                                    "cert sign", "crl sign", "encipher only", "decipher only",
                                    "any", "server auth", "client auth", "code signing",
                                    "email protection", "s/mime", "ipsec end system",
                                    "ipsec tunnel", "ipsec user", "timestamping", "ocsp signing",
                                    "microsoft sgc", "netscape sgc"]}),
            "privateKey": obj({"algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                               "size": {"type": "integer"},
                               "encoding": {"enum": ["PKCS1", "PKCS8"]},
                               "rotationPolicy": {"enum": ["Never", "Always"]}}),
        }, ["secretName", "issuerRef"]),
    }, ["apiVersion", "kind", "metadata", "spec"]),
    ("monitoring.coreos.com/v1", "PodMonitor"): obj({
        "apiVersion": S, "kind": S, "metadata": METADATA,
        "spec": obj({
            "jobLabel": S,
            "selector": obj({"matchLabels": LABELS, "matchExpressions": arr(obj(
                {"key": S, "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                 "values": arr(S)}, ["key", "operator"]))}),
            "namespaceSelector": obj({"any": {"type": "boolean"}, "matchNames": arr(S)}),
            "podMetricsEndpoints": arr(obj({
                "port": S, "portNumber": {"type": "integer"}, "path": S,
                "scheme": {"enum": ["http", "https"]}, "interval": DURATION,
                "scrapeTimeout": DURATION, "honorLabels": {"type": "boolean"},
                "relabelings": arr(obj({
                    "sourceLabels": arr(S), "separator": S, "targetLabel": S, "regex": S,
                    "modulus": {"type": "integer"}, "replacement": S,
                    "action": {"enum": ["replace", "keep", "drop", "hashmod", "labelmap",
                                        "labeldrop", "labelkeep", "lowercase", "uppercase",
                                        "keepequal", "dropequal"]}})),
            })),
        }, ["selector"]),
    }, ["apiVersion", "kind", "metadata", "spec"]),
    ("monitoring.coreos.com/v1", "PrometheusRule"): obj({
        "apiVersion": S, "kind": S, "metadata": METADATA,
        "spec": obj({"groups": arr(obj({
            "name": S, "interval": DURATION,
            "rules": arr({"type": "object", "additionalProperties": False,
                          "required": ["expr"], "oneOf": [{"required": ["alert"]},
                                                          {"required": ["record"]}],
                          "properties": {"alert": S, "record": S, "expr": S, "for": DURATION,
                                         "keep_firing_for": DURATION, "labels": LABELS,
                                         "annotations": LABELS}}),
        }, ["name", "rules"]))}, ["groups"]),
    }, ["apiVersion", "kind", "metadata", "spec"]),
}


def is_custom(api_version):
    """Built-in groups have no dot (core, apps, policy) or end in .k8s.io."""
    group = api_version.split("/")[0] if "/" in api_version else ""
    return "." in group and not group.endswith(".k8s.io")


def main(paths):
    """Validates the custom resources in `paths`; prints the built-in ones to stdout."""
    builtin, checked = [], 0
    for path in paths:
        for doc in yaml.safe_load_all(open(path)):
            if not doc:
                continue
            key = (doc.get("apiVersion"), doc.get("kind"))
            if key in SCHEMAS:
                jsonschema.validate(doc, SCHEMAS[key])
                checked += 1
            elif is_custom(key[0]):
                sys.exit(f"{path}: no schema for {key}")
            else:
                builtin.append(doc)
    yaml.safe_dump_all(builtin, sys.stdout)
    print(f"custom resources: {checked} valid", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
