"""The deployment kit (collector-config/, docker-compose.yml, deploy/) checked without Docker.

The configs must be internally consistent (pipelines, ports, pinned images), and every metric a
dashboard panel or alert rule queries must be a name Prometheus will really show for what
traintel emits, on both roads there: a direct scrape (``OTEL_METRICS_EXPORTER=prometheus``, the
names read back from the exporter itself) and OTLP through the collector (the names generated
from a real run's metrics passed through Prometheus' OTLP translation rules). So renaming a
metric or changing its unit breaks this test instead of leaving an empty panel; the queries
themselves run on a real Prometheus in tests/test_prometheus_real.py.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics.export import Gauge, Histogram, InMemoryMetricReader, Sum
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import traintel
from tests import reference_job
from tests.test_metrics import ms, run_loop
from traintel import callbacks, semconv
from traintel.distributed.collectives import SEQUENCE

ROOT = Path(__file__).resolve().parent.parent
COLLECTOR_DIR = ROOT / "collector-config"
DEPLOY = ROOT / "deploy"
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
JAEGER_CONFIG = DEPLOY / "jaeger" / "config.yaml"
#: Jaeger with ClickHouse storage instead of memory (JAEGER_CONFIG=config-clickhouse.yaml).
JAEGER_CLICKHOUSE = DEPLOY / "jaeger" / "config-clickhouse.yaml"
TEMPO_CONFIG = DEPLOY / "tempo" / "tempo.yaml"
CLICKHOUSE_DIR = DEPLOY / "clickhouse"
COLLECTOR_CONFIGS = sorted(COLLECTOR_DIR.glob("*.yaml"))
DASHBOARDS = sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))
GRAFANA_PROVISIONING = DEPLOY / "grafana" / "provisioning"
RULE_FILES = sorted((DEPLOY / "prometheus" / "rules").glob("*.yml"))
PROMETHEUS_CONFIG = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
README = (ROOT / "README.md").read_text()
#: The deployment kit's page in the docs site.
DEPLOY_DOC = (ROOT / "docs" / "operations" / "deployment.md").read_text()

#: Kinds and units of metrics whose names are pinned in semconv.py but whose instruments other
#: issues are still implementing (cross-rank, self-telemetry), or that this CPU-only run cannot
#: emit (the torch.cuda allocator gauges of system_metrics.py report only with CUDA, the NVML
#: gauges of gpu.py only with a GPU; tests/test_gpu.py checks those against this table), as
#: agreed for those issues; hw.* units follow the OTel semantic conventions. ONE place:
#: once they exist, delete the entries and the real run below reports them instead (an entry
#: that the run also emits fails ``test_pending_table_does_not_shadow_real_instruments``).
PENDING_INSTRUMENTS: dict[str, tuple[str, str]] = {
    semconv.METRIC_HW_GPU_MEMORY_USAGE: ("gauge", "By"),
    semconv.METRIC_HW_GPU_MEMORY_LIMIT: ("gauge", "By"),
    semconv.METRIC_HW_GPU_UTILIZATION: ("gauge", "1"),
    semconv.METRIC_HW_TEMPERATURE: ("gauge", "Cel"),
    semconv.METRIC_HW_POWER: ("gauge", "W"),
    semconv.METRIC_DEVICE_MEMORY_ALLOCATED: ("gauge", "By"),
    semconv.METRIC_DEVICE_MEMORY_RESERVED: ("gauge", "By"),
    semconv.METRIC_DEVICE_MEMORY_PEAK: ("gauge", "By"),
    semconv.METRIC_DEVICE_MEMORY_ALLOC_RETRIES: ("counter", "{retry}"),
    semconv.METRIC_DEVICE_MEMORY_OOMS: ("counter", "{oom}"),
}
#: Span attributes the pending instruments put on their points (see semconv.py).
PENDING_ATTRIBUTES = (semconv.DROP_REASON, semconv.HW_ID)


# --- Prometheus' OTLP translation (otlptranslator, strategy UnderscoreEscapingWithSuffixes) ----
_UNITS = {
    "d": "days", "h": "hours", "min": "minutes", "s": "seconds", "ms": "milliseconds",
    "us": "microseconds", "ns": "nanoseconds", "By": "bytes", "KiBy": "kibibytes",
    "MiBy": "mebibytes", "GiBy": "gibibytes", "TiBy": "tibibytes", "KBy": "kilobytes",
    "MBy": "megabytes", "GBy": "gigabytes", "TBy": "terabytes", "m": "meters", "V": "volts",
    "A": "amperes", "J": "joules", "W": "watts", "g": "grams", "Cel": "celsius", "Hz": "hertz",
    "1": "", "%": "percent",
}  # fmt: skip
_PER_UNITS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month", "y": "year"}


def _clean(unit: str) -> str:
    return re.sub("_+", "_", re.sub("[^a-zA-Z0-9:]", "_", unit)).lstrip("_")


def prometheus_metric_name(name: str, unit: str, kind: str) -> str:
    """The series name Prometheus 3 gives an OTLP metric (kind: counter, updowncounter, gauge,
    histogram). Unit annotations in braces vanish; ``a/b`` becomes ``a_per_b``; a unit already
    among the name's words is not repeated; ``_total`` for monotonic sums, ``_ratio`` for gauges
    in unit 1."""
    tokens = [t for t in re.split("[^a-zA-Z0-9:]", name) if t]
    main_unit, _, per_unit = (part.strip() for part in unit.partition("/"))
    main = "" if not main_unit or "{" in main_unit or "}" in main_unit else _UNITS.get(main_unit, main_unit)
    per = ""
    if per_unit and "{" not in per_unit and "}" not in per_unit:
        per = "per_" + _PER_UNITS.get(per_unit, per_unit)
    main, per = _clean(main), _clean(per)
    if main in tokens:
        main = ""
    per = "" if per == "per_" else per.rstrip("_")
    if per in tokens:
        per = ""
    if per:
        main = main.rstrip("_")
    tokens += [suffix for suffix in (main, per) if suffix]
    if kind == "counter":
        tokens = [t for t in tokens if t != "total"] + ["total"]
    if unit == "1" and kind == "gauge":
        tokens = [t for t in tokens if t != "ratio"] + ["ratio"]
    joined = "_".join(tokens)
    return "_" + joined if joined[:1].isdigit() else joined


def prometheus_label(attribute: str) -> str:
    label = re.sub("[^a-zA-Z0-9_]", "_", attribute)
    return "key_" + label if label[:1].isdigit() else label


def series_names(name: str, unit: str, kind: str) -> set[str]:
    base = prometheus_metric_name(name, unit, kind)
    if kind == "histogram":
        return {base + "_bucket", base + "_sum", base + "_count"}
    return {base}


# --- a direct scrape: the OpenTelemetry Python prometheus exporter and prometheus_client ----------
_DIRECT_UNITS = {**_UNITS, "1": ""}  # no `_ratio`: the exporter maps unit 1 to nothing


def scraped_metric_name(name: str, unit: str, kind: str) -> str:
    """The name a direct scrape shows: the name sanitised, the unit appended unless the name
    already ends with it (``seconds_since_progress`` gets ``_seconds``), ``_total`` on counters;
    no ``_ratio``. Checked against the exporter's real output below."""
    base = re.sub("[^a-zA-Z0-9:]+", "_", name)
    unit = re.sub(r"\{.*\}", "", unit)
    top, _, bottom = unit.partition("/")
    if bottom:
        top = _DIRECT_UNITS.get(top, top)
        per = "per_" + _PER_UNITS.get(bottom, bottom)
        suffix = f"{top}_{per}" if top else per
    else:
        suffix = _DIRECT_UNITS.get(unit, re.sub("[^a-zA-Z0-9:]+", "_", unit).strip("_"))
    if kind == "counter" and base.endswith("_total"):
        base = base[: -len("_total")]
    if suffix and not base.endswith("_" + suffix):
        base += "_" + suffix
    return base + "_total" if kind == "counter" else base


def scraped_series_names(name: str, unit: str, kind: str) -> set[str]:
    base = scraped_metric_name(name, unit, kind)
    if kind == "histogram":
        return {base + "_bucket", base + "_sum", base + "_count"}
    return {base}


@pytest.mark.parametrize(
    ("name", "unit", "kind", "expected"),
    [  # otlptranslator's own documented examples, then the cases traintel's units exercise
        ("http.server.request.duration", "s", "histogram", "http_server_request_duration_seconds"),
        ("requests.count", "1", "counter", "requests_count_total"),
        ("memory.usage", "By", "gauge", "memory_usage_bytes"),
        ("ml.training.sample_throughput", "{sample}/s", "gauge", "ml_training_sample_throughput_per_second"),
        ("ml.training.flops_throughput", "FLOP/s", "gauge", "ml_training_flops_throughput_FLOP_per_second"),
        ("ml.training.mfu", "1", "gauge", "ml_training_mfu_ratio"),
        ("ml.training.samples", "{sample}", "counter", "ml_training_samples_total"),
        ("a.seconds_since_progress", "s", "gauge", "a_seconds_since_progress"),  # unit already a word
        ("hw.temperature", "Cel", "gauge", "hw_temperature_celsius"),
        ("queue.size", "{item}", "updowncounter", "queue_size"),
    ],
)  # fmt: skip
def test_prometheus_name_translation(name: str, unit: str, kind: str, expected: str) -> None:
    assert prometheus_metric_name(name, unit, kind) == expected


# --- what traintel really emits ---------------------------------------------------------------
def _kind(data: Any) -> str:
    if isinstance(data, Histogram):
        return "histogram"
    if isinstance(data, Sum):
        return "counter" if data.is_monotonic else "updowncounter"
    assert isinstance(data, Gauge), data
    return "gauge"


@pytest.fixture
def emitted() -> Iterator[dict[str, Any]]:
    """A real run through every metric-producing path: windows with MFU and tokens, goodput,
    checkpoint save (with stages) and load, validation. Returns instruments, point attributes
    and the resource attributes as the metric reader exported them."""
    reader = InMemoryMetricReader()
    scraped = PrometheusMetricReader()  # what a direct scrape shows (its registry: prometheus_client's)
    traintel.configure(
        span_exporters=[InMemorySpanExporter()], metric_readers=[reader, scraped], log_every_n_iterations=2,
        global_batch_size=4, seq_len=8, flops_per_sample=1e3, peak_flops=1e5,
        session_tag="deploy-test", perf_tag="p",
    )  # fmt: skip
    callbacks.on_load_checkpoint_start(start_time_msec=ms(-2))
    callbacks.on_load_checkpoint_end(finish_time_msec=ms(-1))
    end = run_loop([1.0, 1.0, 1.0, 2.0, 1.0, 1.0])
    callbacks.on_save_checkpoint_start(global_step=6, start_time_msec=ms(end + 1), size_bytes=1000)
    with traintel.checkpoint_stage("write"):
        pass
    callbacks.on_save_checkpoint_end(finish_time_msec=ms(end + 2))
    with contextlib.suppress(OSError), traintel.checkpoint_save(iteration=7):
        raise OSError(28, "No space left on device")  # (the checkpoint failure counter)
    callbacks.on_validation_start()
    callbacks.on_validation_single_iteration_start()
    callbacks.on_validation_single_iteration_end()
    callbacks.on_validation_end()
    # Cross-rank statistics as rank 0 reports them after a gather (the gather itself needs two
    # processes: tests/test_ranks.py), with rank 1 lagging.
    cross_rank = traintel.get_telemetry().cross_rank
    assert cross_rank is not None
    cross_rank.world = 2
    cross_rank._gathered([[0.0, 2.0, 1.0, 0.1, 0.2, 1.0, 1.0, 0.0], [0.0, 2.0, 1.0, 0.1, 0.6, 1.0, 1.0, 0.0]])
    # A collective as a rank counts it (for real, several ranks: tests/test_hang_ranks.py).
    SEQUENCE.enter("all_reduce")
    SEQUENCE.complete()
    instruments: dict[str, tuple[str, str]] = {}
    attributes: set[str] = set()
    resource: set[str] = set()
    data = reader.get_metrics_data()
    assert data is not None
    for resource_metrics in data.resource_metrics:
        resource |= set(resource_metrics.resource.attributes)
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                instruments[metric.name] = (_kind(metric.data), metric.unit or "")
                for point in metric.data.data_points:
                    attributes |= set(point.attributes or {})
    exposition = generate_latest(REGISTRY).decode()
    families = text_string_to_metric_families(exposition)
    scrape = {sample.name for family in families for sample in family.samples}
    yield {"instruments": instruments, "attributes": attributes, "resource": resource, "scraped": scrape}
    traintel.shutdown(1.0)


def span_metrics_series(config: dict[str, Any]) -> set[str]:
    """Series the collector's span_metrics connector produces (calls counter, duration histogram)."""
    connector = config["connectors"]["span_metrics"]
    namespace = connector.get("namespace", "traces.span.metrics")
    unit = connector.get("histogram", {}).get("unit", "ms")
    return series_names(namespace + ".calls", "", "counter") | series_names(
        namespace + ".duration", unit, "histogram"
    )


def load_yaml(path: Path) -> dict[str, Any]:
    loaded = yaml.safe_load(path.read_text())
    assert isinstance(loaded, dict), path
    return loaded


MAIN_COLLECTOR = load_yaml(COLLECTOR_DIR / "collector.yaml")
#: Labels Prometheus or the span_metrics connector add besides metric and resource attributes.
BUILTIN_LABELS = {
    "le", "job", "instance", "service_name", "span_name", "span_kind", "status_code", "__name__",
}  # fmt: skip


#: Series Prometheus makes itself: the resource of every process (its run id, session, rank...).
TARGET_INFO = "target_info"
#: Series the recording rules make (they carry the identity they joined from target_info).
RECORDED = {
    rule["record"]
    for path in RULE_FILES
    for g in load_yaml(path)["groups"]
    for rule in g["rules"]
    if "record" in rule
}


def roads(emitted: dict[str, Any]) -> list[tuple[set[str], set[str]]]:
    """Per instrument: (the series a direct scrape shows, the series OTLP through the collector
    gives). The collector's span metrics and target_info are the same on both."""
    instruments = {**PENDING_INSTRUMENTS, **emitted["instruments"]}
    out = [
        (scraped_series_names(name, unit, kind), series_names(name, unit, kind))
        for name, (kind, unit) in instruments.items()
    ]
    out += [({name}, {name}) for name in span_metrics_series(MAIN_COLLECTOR) | {TARGET_INFO} | RECORDED]
    return out


def expected_series(emitted: dict[str, Any]) -> set[str]:
    return set().union(*(direct | otlp for direct, otlp in roads(emitted)))


def test_direct_scrape_names_are_what_the_exporter_serves(emitted: dict[str, Any]) -> None:
    """The replica of the exporter's naming gives the names its real output has (so the pending
    instruments' names, computed the same way, are right too)."""
    computed = set().union(
        *(scraped_series_names(name, unit, kind) for name, (kind, unit) in emitted["instruments"].items())
    )
    assert computed <= emitted["scraped"], sorted(computed - emitted["scraped"])
    assert scraped_metric_name("ml.training.mfu", "1", "gauge") == "ml_training_mfu"
    assert scraped_metric_name("ml.training.heartbeat.seconds_since_progress", "s", "gauge") == (
        "ml_training_heartbeat_seconds_since_progress_seconds"
    )


def test_pending_table_does_not_shadow_real_instruments(emitted: dict[str, Any]) -> None:
    assert not set(PENDING_INSTRUMENTS) & set(emitted["instruments"]), "now real: delete from the table"


def test_the_run_emits_the_core_training_metrics(emitted: dict[str, Any]) -> None:
    """The generated names come from a run that exercises every instrument the dashboard uses."""
    for name in (
        semconv.METRIC_ITERATION_DURATION, semconv.METRIC_SAMPLE_THROUGHPUT, semconv.METRIC_TOKEN_THROUGHPUT,
        semconv.METRIC_MFU, semconv.METRIC_GOODPUT, semconv.METRIC_BADPUT,
        semconv.METRIC_CHECKPOINT_SAVE_DURATION, semconv.METRIC_CHECKPOINT_LOAD_DURATION,
        semconv.METRIC_DATA_LOADING_DURATION, semconv.METRIC_PHASE_DURATION,
    ):  # fmt: skip
        assert name in emitted["instruments"], name


# --- extracting metric and label names from PromQL --------------------------------------------
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "and", "or",
             "unless", "bool", "inf", "nan"}  # fmt: skip
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


def grafana_to_promql(expr: str) -> str:
    """Grafana's variables replaced by values of the right shape."""
    expr = re.sub(r"\$__(rate_interval|interval|range)", "5m", expr)
    return re.sub(r"\$\{?[a-zA-Z_]+(:[a-z]+)?\}?", ".*", expr)


_NAME_MATCHER = re.compile(r'__name__\s*=~?\s*"([^"]*)"')


def name_alternatives(expr: str) -> list[set[str]]:
    """Each metric a query selects, as the names that may hold it: a plain name, or the
    alternatives of a ``{__name__=~"a|b"}`` selector (one metric under its two roads' names)."""
    expr = grafana_to_promql(expr)
    out = [set(m.group(1).split("|")) for m in _NAME_MATCHER.finditer(expr)]
    return out + [{name} for name in metric_names(expr)]


def metric_names(expr: str) -> set[str]:
    expr = grafana_to_promql(expr)
    expr = re.sub(r"\{[^}]*\}", " ", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", " ", expr)  # range selectors
    expr = _LABEL_LIST.sub(" ", expr)  # by (...) etc.
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', " ", expr)
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", expr):
        word, call = match.group(1), match.group(2)
        if not call and word not in _KEYWORDS:
            names.add(word)
    return names


def label_uses(expr: str) -> Iterator[tuple[str, str | None, str | None]]:
    """(label, operator, value) for matchers; (label, None, None) for by/without/on lists."""
    expr = grafana_to_promql(expr)
    for selector in re.findall(r"\{([^}]*)\}", expr):
        for label, operator, value in _MATCHER.findall(selector):
            yield label, operator, value
    for _, labels in _LABEL_LIST.findall(expr):
        for label in filter(None, (part.strip() for part in labels.split(","))):
            yield label, None, None


def label_values_query(query: str) -> tuple[str, str]:
    match = re.fullmatch(r"\s*label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*", query)
    assert match, query
    return match.group(1), match.group(2)


def dashboard_queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every Prometheus query of the dashboard, annotations and variables
    included."""

    def panels(items: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for item in items:
            yield item
            yield from panels(item.get("panels", []))

    for panel in panels(dashboard["panels"]):
        for target in panel.get("targets", []):
            if (target.get("datasource") or panel.get("datasource") or {}).get("uid") == "prometheus":
                yield f"panel {panel['title']!r}", target["expr"]
    for annotation in dashboard["annotations"]["list"]:
        if (annotation.get("datasource") or {}).get("uid") == "prometheus":
            yield f"annotation {annotation['name']!r}", annotation["expr"]
    for variable in dashboard["templating"]["list"]:
        selector, label = label_values_query(variable["definition"])
        yield f"variable {variable['name']!r}", f"count by ({label}) ({selector})"


def all_queries() -> list[tuple[str, str]]:
    queries = [
        (f"{path.name}: {where}", expr)
        for path in DASHBOARDS
        for where, expr in dashboard_queries(json.loads(path.read_text()))
    ]
    for path in RULE_FILES:
        for group in load_yaml(path)["groups"]:
            for rule in group["rules"]:
                what = f"alert {rule['alert']}" if "alert" in rule else f"record {rule['record']}"
                queries.append((f"{path.name}: {what}", rule["expr"]))
    return queries


QUERIES = all_queries()


def test_there_are_panels_and_alerts_to_check() -> None:
    assert len(DASHBOARDS) == 1 and [p.name for p in RULE_FILES] == [
        "traintel-alerts.yml",
        "traintel-goodput.yml",
    ]
    alerts = {where.split("alert ")[1] for where, _ in QUERIES if "alert " in where}
    assert {"TraintelRankStalled", "TraintelStraggler", "TraintelGoodputLow", "TraintelMfuDrop"} <= alerts
    assert len(QUERIES) >= 30


def test_metric_name_extraction() -> None:
    expr = (
        'sum by (le) (rate(a_b_bucket{x=~"$run", y="z"}[$__rate_interval]))'
        " / ignoring (r) group_left () c offset 10m > 0.8 * d"
    )
    assert metric_names(expr) == {"a_b_bucket", "c", "d"}
    assert set(label_uses(expr)) == {
        ("x", "=~", ".*"),
        ("y", "=", "z"),
        ("le", None, None),
        ("r", None, None),
    }


def test_every_queried_metric_is_a_name_traintel_emits(emitted: dict[str, Any]) -> None:
    expected = expected_series(emitted)
    unknown = {
        (where, name)
        for where, expr in QUERIES
        for names in name_alternatives(expr)
        for name in names - expected
    }
    assert not unknown, f"not a Prometheus name of anything traintel emits: {sorted(unknown)}"


def test_every_queried_metric_is_found_on_both_roads(emitted: dict[str, Any]) -> None:
    """A direct scrape and OTLP name some metrics differently (``ml_training_goodput`` and
    ``ml_training_goodput_ratio``): a query must select the metric under both names."""
    one_road = [
        (where, sorted(names))
        for where, expr in QUERIES
        for names in name_alternatives(expr)
        if not any(names & direct and names & otlp for direct, otlp in roads(emitted))
    ]
    assert not one_road, f"found on one road only: {one_road}"


def test_every_queried_label_is_an_attribute_traintel_sets(emitted: dict[str, Any]) -> None:
    """Point attributes are labels on their series; resource attributes are labels of
    ``target_info`` only (a direct scrape, and Prometheus' OTLP translation without promotion),
    so a query that uses one joins target_info on (job, instance)."""
    point_attributes = emitted["attributes"] | set(PENDING_ATTRIBUTES) | {semconv.PHASE}
    resource = {prometheus_label(a) for a in emitted["resource"]}
    allowed = {prometheus_label(a) for a in point_attributes} | resource | BUILTIN_LABELS
    unknown = {
        (where, label) for where, expr in QUERIES for label, _, _ in label_uses(expr) if label not in allowed
    }
    assert not unknown, f"labels Prometheus will not have: {sorted(unknown)}"
    unjoined = {
        where
        for where, expr in QUERIES
        if {label for label, _, _ in label_uses(expr)} & (resource - BUILTIN_LABELS)
        and not re.search(r"on \(job, instance\)[^()]*(\([^()]*\))?\s*target_info", expr)
        and not expr.lstrip().startswith(("count by", "target_info"))
        and not metric_names(expr) <= RECORDED  # recorded with the identity joined in the rule
    }
    assert not unjoined, f"resource labels used without the target_info join: {sorted(unjoined)}"
    assert "promote_resource_attributes" not in PROMETHEUS_CONFIG["otlp"], "one way to the run identity"
    # The run identity and the rank are what panels filter and split by.
    assert {semconv.RUN_ID, semconv.SESSION_TAG, semconv.RANK} <= emitted["resource"]


def test_label_values_in_queries_exist() -> None:
    """A matcher on a phase or badput category must be able to match a value traintel emits."""
    known = {
        # phase spans, and the step phases of ml.training.iteration.phase_time
        prometheus_label(semconv.PHASE): {p.value for p in semconv.Phase}
        | {"data_loading", "forward", "backward", "optimizer"},
        prometheus_label(semconv.BADPUT_CATEGORY): set(semconv.BADPUT_CATEGORIES),
        prometheus_label(semconv.THROUGHPUT_SCOPE): {"job", "device"},
        prometheus_label(semconv.STATISTIC): {"min", "median", "max", "p99"},
    }  # fmt: skip
    for where, expr in QUERIES:
        for label, operator, value in label_uses(expr):
            if label in known and operator in ("=", "=~"):
                pattern = re.escape(value) if operator == "=" else value
                assert any(re.fullmatch(pattern, v) for v in known[label]), (where, label, value)


# --- collector pipelines ------------------------------------------------------------------------
ALL_COLLECTOR_CONFIGS = [*COLLECTOR_CONFIGS, JAEGER_CONFIG, JAEGER_CLICKHOUSE]
#: Component types the collector renamed to lower_snake_case; the old names log deprecations.
DEPRECATED_TYPES = {"exporters": {"otlp", "otlphttp", "loadbalancing"}, "connectors": {"spanmetrics"}}


@pytest.mark.parametrize("path", COLLECTOR_CONFIGS, ids=lambda p: p.name)
def test_every_collector_serves_its_own_metrics_where_prometheus_scrapes_them(path: Path) -> None:
    """Prometheus' otel-collector job scrapes port 8888 of whichever config runs (and the gateways
    are scaled on those metrics); the collector serves them on localhost only by default."""
    (job,) = [j for j in PROMETHEUS_CONFIG["scrape_configs"] if j["job_name"] == "otel-collector"]
    (target,) = job["static_configs"][0]["targets"]
    (reader,) = load_yaml(path)["service"]["telemetry"]["metrics"]["readers"]
    exporter = reader["pull"]["exporter"]["prometheus"]
    assert (exporter["host"], str(exporter["port"])) == ("0.0.0.0", target.split(":")[1])


@pytest.mark.parametrize("path", ALL_COLLECTOR_CONFIGS, ids=lambda p: p.name)
def test_pipelines_reference_only_defined_components(path: Path) -> None:
    config = load_yaml(path)
    defined = {
        kind: set(config.get(kind) or {})
        for kind in ("receivers", "processors", "exporters", "connectors", "extensions")
    }
    service = config["service"]
    assert set(service.get("extensions", [])) == defined["extensions"]
    used: dict[str, set[str]] = {kind: set() for kind in defined}
    connectors_in, connectors_out = set(), set()
    for name, pipeline in service["pipelines"].items():
        receivers, processors, exporters = (
            pipeline.get(k, []) for k in ("receivers", "processors", "exporters")
        )
        assert receivers and exporters, name
        assert set(receivers) <= defined["receivers"] | defined["connectors"], (name, receivers)
        assert set(processors) <= defined["processors"], (name, processors)
        assert set(exporters) <= defined["exporters"] | defined["connectors"], (name, exporters)
        if "memory_limiter" in defined["processors"]:
            assert processors[:1] == ["memory_limiter"], f"{name}: memory_limiter must come first"
        connectors_in |= set(exporters) & defined["connectors"]
        connectors_out |= set(receivers) & defined["connectors"]
        for kind, names in (("receivers", receivers), ("processors", processors), ("exporters", exporters)):
            used[kind] |= set(names)
    assert connectors_in == connectors_out == defined["connectors"], "a connector must both receive and emit"
    for kind in ("receivers", "processors", "exporters"):
        assert defined[kind] <= used[kind], f"defined but unused {kind}: {defined[kind] - used[kind]}"
    for kind, deprecated in DEPRECATED_TYPES.items():
        assert not {c.split("/")[0] for c in defined[kind]} & deprecated, (kind, defined[kind])


@pytest.mark.parametrize("name", ["collector.yaml", "agent.yaml", "gateway.yaml"])
def test_production_collectors_limit_memory_and_batch(name: str) -> None:
    pipelines = load_yaml(COLLECTOR_DIR / name)["service"]["pipelines"]
    assert {"traces", "metrics"} <= set(pipelines)
    for pipeline in pipelines.values():
        assert pipeline["processors"] == ["memory_limiter", "batch"]


def test_main_collector_fans_out_to_every_backend() -> None:
    pipelines = MAIN_COLLECTOR["service"]["pipelines"]
    assert {"otlp_grpc/jaeger", "otlp_grpc/tempo", "span_metrics"} <= set(pipelines["traces"]["exporters"])
    assert pipelines["metrics"]["exporters"] == ["otlp_http/prometheus"]
    assert set(MAIN_COLLECTOR["receivers"]["otlp"]["protocols"]) == {"grpc", "http"}


def test_agents_route_traces_by_trace_id_to_the_gateways() -> None:
    agent, gateway = load_yaml(COLLECTOR_DIR / "agent.yaml"), load_yaml(COLLECTOR_DIR / "gateway.yaml")
    balancer = agent["exporters"]["load_balancing"]
    assert balancer["routing_key"] == "traceID"
    assert "load_balancing" in agent["service"]["pipelines"]["traces"]["exporters"]
    # span metrics per rank are made on the agent: the gateway sees a rank's spans split by trace
    assert "span_metrics" in agent["connectors"] and "connectors" not in gateway
    assert balancer["resolver"]["dns"]["port"] == port_of(
        gateway["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
    )


@pytest.mark.parametrize("path", COLLECTOR_CONFIGS, ids=lambda p: p.name)
def test_every_collector_takes_the_hang_reports(path: Path) -> None:
    """traintel sends its hang reports as OTLP log records to the same endpoint as its spans: a
    collector without a logs pipeline does not serve the logs service and refuses them."""
    logs = load_yaml(path)["service"]["pipelines"].get("logs")
    assert logs is not None and logs["receivers"] == ["otlp"] and logs["exporters"], path.name


def test_debug_variant_prints_and_writes_everything() -> None:
    debug = load_yaml(COLLECTOR_DIR / "collector-debug.yaml")
    for pipeline in debug["service"]["pipelines"].values():
        assert set(pipeline["exporters"]) == {"debug", "file"}
    assert debug["exporters"]["file"]["format"] == "json"


# --- the span_metrics dimension is an attribute traintel sets ----------------------------------
def test_span_metrics_dimension_is_set_on_every_phase_span(pipeline: Any) -> None:
    configs = [load_yaml(p) for p in COLLECTOR_CONFIGS]
    dimensions = {
        d["name"]
        for c in configs
        for d in c.get("connectors", {}).get("span_metrics", {}).get("dimensions", [])
    }
    assert dimensions == {semconv.PHASE}
    reference_job.with_context_managers()
    spans = [s for s in pipeline.spans() if s.name not in reference_job.RECORDS]
    assert {s.name for s in spans} == set(reference_job.EXPECTED_PARENTS) - reference_job.RECORDS
    for span in spans:
        assert (span.attributes or {}).get(semconv.PHASE) == span.name, span.name


# --- ports and images ---------------------------------------------------------------------------
def port_of(endpoint: str) -> int:
    return int(re.search(r":(\d+)(/|$)", endpoint).group(1))  # type: ignore[union-attr]


def endpoints(node: Any) -> Iterator[str]:
    """Every `endpoint:` value (and Tempo-style listen ports) anywhere in a config."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "endpoint" and isinstance(value, str):
                yield value
            elif key in ("http_listen_port", "grpc_listen_port"):
                yield f"0.0.0.0:{value}"
            elif key == "telemetry":
                for reader in value.get("metrics", {}).get("readers", []):
                    yield f"0.0.0.0:{reader['pull']['exporter']['prometheus']['port']}"
            else:
                yield from endpoints(value)
    elif isinstance(node, list):
        for item in node:
            yield from endpoints(item)


def collector_ports(config: dict[str, Any]) -> set[int]:
    return {port_of(e) for e in endpoints([config["receivers"], config["extensions"], config["service"]])}


def listening_ports(service: str) -> set[int]:
    """Ports the service's own configuration makes it listen on."""
    if service == "collector":
        return collector_ports(MAIN_COLLECTOR)
    if service == "jaeger":
        config = load_yaml(JAEGER_CONFIG)
        return {port_of(e) for e in endpoints({"r": config["receivers"], "e": config["extensions"]})}
    if service == "tempo":
        return {port_of(e) for e in endpoints(load_yaml(DEPLOY / "tempo" / "tempo.yaml"))}
    if service == "prometheus":
        (flag,) = [f for f in SERVICES["prometheus"]["command"] if f.startswith("--web.listen-address=")]
        return {port_of(flag)}
    if service == "clickhouse":
        return {8123, 9000}  # the server's default HTTP and native ports; the image does not change them
    if service == "grafana":
        return {3000}  # Grafana's default http_port; the compose file does not change it
    return set()


def published() -> Iterator[tuple[str, int, int, str]]:
    """(service, host port, container port, bind address) for every `ports:` entry."""
    for name, service in SERVICES.items():
        for entry in service.get("ports", []):
            parts = str(entry).split(":")
            address = parts[0] if len(parts) == 3 else "0.0.0.0"
            yield name, int(parts[-2]), int(parts[-1]), address


def test_published_ports_are_ports_the_services_listen_on() -> None:
    entries = list(published())
    assert entries
    for service, _, container, _ in entries:
        assert container in listening_ports(service), (service, container, listening_ports(service))
    hosts = [host for _, host, _, _ in entries]
    assert len(hosts) == len(set(hosts)), "two services publish the same host port"
    # COLLECTOR_CONFIG may swap in the debug variant: it must listen where the compose file publishes.
    debug = collector_ports(load_yaml(COLLECTOR_DIR / "collector-debug.yaml"))
    assert {container for service, _, container, _ in entries if service == "collector"} <= debug


def test_only_otlp_ingest_is_published_beyond_localhost() -> None:
    for service, host, _, address in published():
        if address != "127.0.0.1":
            assert service == "collector", (service, host)


def test_every_published_port_is_documented() -> None:
    compose_text = (ROOT / "docker-compose.yml").read_text()
    header = compose_text.split("\nname:")[0]
    section = DEPLOY_DOC
    for service, host, _, _ in published():
        assert re.search(rf"\b{host}\b", header), (service, host)
        assert re.search(rf"\b{host}\b", section), (service, host)


def service_urls() -> Iterator[tuple[str, str]]:
    """(where, URL or host:port) of every reference from one service to another."""
    backends = load_yaml(JAEGER_CLICKHOUSE)["extensions"]["jaeger_storage"]["backends"]
    for backend in backends.values():
        for address in backend["clickhouse"]["connection"]["addresses"]:
            yield JAEGER_CLICKHOUSE.name, address
    for path in [*COLLECTOR_CONFIGS, JAEGER_CONFIG, JAEGER_CLICKHOUSE]:
        for endpoint in endpoints(load_yaml(path).get("exporters", {})):
            # ${env:NAME:-default} -> default
            yield path.name, re.sub(r"\$\{env:[A-Z_]+:-([^}]*)\}", r"\1", endpoint)
    datasources = load_yaml(GRAFANA_PROVISIONING / "datasources" / "datasources.yaml")
    for source in datasources["datasources"]:
        yield f"datasource {source['name']}", source["url"]
    for job in PROMETHEUS_CONFIG["scrape_configs"]:
        for static in job["static_configs"]:
            for target in static["targets"]:
                yield f"scrape {job['job_name']}", target


def test_references_between_services_hit_listening_ports() -> None:
    checked = 0
    for where, url in service_urls():
        match = re.fullmatch(r"(?:[a-z]+://)?(?:dns:///)?([a-z0-9-]+):(\d+)(/.*)?", url)
        assert match, (where, url)
        host, port = match.group(1), int(match.group(2))
        if host == "traintel-gateway":  # the agent's gateway DNS name: gateway.yaml's receiver
            gateway = load_yaml(COLLECTOR_DIR / "gateway.yaml")
            assert port in {port_of(e) for e in endpoints(gateway["receivers"])}, (where, url)
            continue
        assert host in SERVICES, (where, url)
        assert port in listening_ports(host), (where, url)
        checked += 1
    assert checked >= 8


def test_prometheus_receives_otlp_and_stores_exemplars() -> None:
    command = SERVICES["prometheus"]["command"]
    assert "--web.enable-otlp-receiver" in command
    assert "--enable-feature=exemplar-storage" in command
    assert PROMETHEUS_CONFIG["otlp"]["translation_strategy"] == "UnderscoreEscapingWithSuffixes"
    datasources = load_yaml(GRAFANA_PROVISIONING / "datasources" / "datasources.yaml")["datasources"]
    by_uid = {d["uid"]: d for d in datasources}
    assert set(by_uid) == {"prometheus", "tempo", "jaeger"}
    (link,) = by_uid["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    assert link == {"name": "trace_id", "datasourceUid": "tempo"}


_DURATION = re.compile(r"(\d+)([smhdwy])")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}


def _seconds(duration: str) -> int:
    """A Prometheus duration (``30d``, ``1h30m``) in seconds."""
    return sum(int(n) * _SECONDS[unit] for n, unit in _DURATION.findall(duration))


def test_prometheus_keeps_what_the_rules_look_back_on() -> None:
    """The session rules add up each job's last value over a range (``last_over_time(...[30d])``):
    samples older than the retention are deleted, and a session's early jobs with them."""
    ranges = {
        _seconds(window)
        for path in RULE_FILES
        for group in load_yaml(path)["groups"]
        for rule in group["rules"]
        for window in re.findall(r"\[(\w+)\]", rule["expr"])
    }
    (retention,) = [
        f for f in SERVICES["prometheus"]["command"] if f.startswith("--storage.tsdb.retention.time=")
    ]
    assert _seconds(retention.split("=", 1)[1]) >= max(ranges) == _seconds("30d")


IMAGE = re.compile(r"^(?P<repo>[a-z0-9./-]+):(?P<tag>v?\d+\.\d+\.\d+(\.\d+)?)$")


def test_every_image_is_pinned_to_an_exact_release() -> None:
    images = {name: service["image"] for name, service in SERVICES.items()}
    assert {"collector", "jaeger", "tempo", "prometheus", "grafana"} <= set(images)
    for name, image in images.items():
        assert IMAGE.match(image), f"{name}: {image} is not pinned to an exact x.y.z tag"
        assert "latest" not in image


def test_images_named_elsewhere_match_the_compose_file() -> None:
    pinned = {IMAGE.match(s["image"]).group("repo"): s["image"] for s in SERVICES.values()}  # type: ignore[union-attr]
    texts = [
        README, DEPLOY_DOC, *(p.read_text() for p in [*COLLECTOR_CONFIGS, JAEGER_CLICKHOUSE, TEMPO_CONFIG]),
    ]  # fmt: skip
    for repo, image in pinned.items():
        for text in texts:
            for mention in re.findall(rf"(?<![\w/.-]){re.escape(repo)}:[\w.-]+", text):
                assert mention == image, (mention, image)


def test_collector_config_selected_by_compose_exists() -> None:
    (argument,) = SERVICES["collector"]["command"]
    default = re.search(r"\$\{COLLECTOR_CONFIG:-([^}]+)\}", argument).group(1)  # type: ignore[union-attr]
    assert (COLLECTOR_DIR / default).is_file()
    config_dir = argument.split("=")[1].rsplit("/", 1)[0]
    assert f"./collector-config:{config_dir}:ro" in SERVICES["collector"]["volumes"]


def test_grafana_provisions_the_dashboard_it_opens() -> None:
    grafana = SERVICES["grafana"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    (provider,) = load_yaml(GRAFANA_PROVISIONING / "dashboards" / "dashboards.yaml")["providers"]
    mounts = dict(v.rsplit(":", 1)[0].split(":", 1)[::-1] for v in grafana["volumes"] if v.startswith("./"))
    host_dir = mounts[provider["options"]["path"]]
    assert (ROOT / host_dir / Path(home).name).is_file()
    dashboard = json.loads((ROOT / host_dir / Path(home).name).read_text())
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["session", "run"]
    exemplar_panels = [t for where, t in dashboard_queries(dashboard) if "exemplar" in where.lower()]
    assert exemplar_panels and all(
        "traces_span_metrics_duration_seconds_bucket" in t for t in exemplar_panels
    )


def test_the_docs_name_every_pinned_version() -> None:
    """One version per component: the compose file's pins are the versions the docs state."""
    for name, service in SERVICES.items():
        tag = IMAGE.match(service["image"]).group("tag")  # type: ignore[union-attr]
        assert re.search(rf"(?<![\w.]){re.escape(tag)}(?![\w.])", DEPLOY_DOC), (name, tag)
    collector_tag = IMAGE.match(SERVICES["collector"]["image"]).group("tag")  # type: ignore[union-attr]
    assert f"v{collector_tag}" in (CLICKHOUSE_DIR / "otel_tables.sql").read_text(), (
        "the exporter schema's version"
    )


# --- Tempo 3, ClickHouse, Jaeger on ClickHouse: checked structurally (no Docker here) -------------
#: Sections of a Tempo 2 config that Tempo 3 removed (it refuses to start with them).
TEMPO_2_ONLY = {"ingester", "ingester_client", "compactor", "metrics_generator_client"}
#: Top-level sections of a Tempo 3 monolithic config.
TEMPO_3_SECTIONS = {
    "target", "stream_over_http_enabled", "server", "distributor", "live_store", "backend_scheduler",
    "backend_worker", "querier", "query_frontend", "metrics_generator", "storage", "overrides",
    "memberlist", "usage_report", "cache", "ingest", "block_builder",
}  # fmt: skip


def _keys(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield str(key)
            yield from _keys(value)
    elif isinstance(node, list):
        for item in node:
            yield from _keys(item)


def test_tempo_is_3_with_traceql_metrics_over_whole_runs() -> None:
    assert IMAGE.match(SERVICES["tempo"]["image"]).group("tag").startswith("3.")  # type: ignore[union-attr]
    tempo = load_yaml(TEMPO_CONFIG)
    assert set(tempo) <= TEMPO_3_SECTIONS, set(tempo) - TEMPO_3_SECTIONS
    assert not set(tempo) & TEMPO_2_ONLY
    # 3.0 removed the local-blocks processor; TraceQL metrics need none
    assert not {k for k in _keys(tempo) if k.replace("-", "_") == "local_blocks"}
    retention = {
        tempo["backend_worker"]["compaction"]["block_retention"],
        tempo["backend_scheduler"]["provider"]["compaction"]["compaction"]["block_retention"],
    }
    assert len(retention) == 1, retention
    assert tempo["query_frontend"]["metrics"]["max_duration"] == "168h"
    assert tempo["storage"]["trace"]["backend"] == "local"
    # the chown helper cannot be the Tempo image (no shell or chown in it since 2.10)
    assert "tempo" not in SERVICES["tempo-init"]["image"]


def test_gateway_writes_traces_and_metrics_to_clickhouse_next_to_the_other_routes() -> None:
    gateway = load_yaml(COLLECTOR_DIR / "gateway.yaml")
    pipelines = gateway["service"]["pipelines"]
    assert pipelines["traces"]["exporters"] == ["otlp_grpc/jaeger", "otlp_grpc/tempo", "clickhouse"]
    assert pipelines["metrics"]["exporters"] == ["otlp_http/prometheus", "clickhouse"]
    exporter = gateway["exporters"]["clickhouse"]
    assert exporter["database"] == "otel" and exporter["create_schema"] is True
    # the default table names, which traintel_views.sql reads
    assert not {k for k in exporter if k.endswith("table_name") or k == "metrics_tables"}


def test_clickhouse_runs_as_a_profile_with_the_tables_and_views_created_on_first_start() -> None:
    clickhouse = SERVICES["clickhouse"]
    assert clickhouse["profiles"] == ["clickhouse"]
    mounts = {v.split(":")[1]: ROOT / v.split(":")[0] for v in clickhouse["volumes"] if v.startswith("./")}
    init = mounts["/docker-entrypoint-initdb.d"]
    (script,) = init.glob("*.sh")
    text = script.read_text()
    for path in re.findall(r"< (/traintel/\S+)", text):
        assert (mounts["/traintel"] / path.removeprefix("/traintel/")).is_file(), path
    assert "--database otel" in text
    jaeger = load_yaml(JAEGER_CLICKHOUSE)["extensions"]["jaeger_storage"]["backends"]
    databases = {b["clickhouse"]["connection"]["auth"]["database"] for b in jaeger.values()}
    assert databases == {"jaeger"} and "CREATE DATABASE IF NOT EXISTS jaeger" in text


def test_jaeger_on_clickhouse_is_the_in_memory_config_with_another_store() -> None:
    memory, clickhouse = load_yaml(JAEGER_CONFIG), load_yaml(JAEGER_CLICKHOUSE)
    store = clickhouse["exporters"]["jaeger_storage_exporter"]["trace_storage"]
    assert clickhouse["extensions"]["jaeger_query"]["storage"]["traces"] == store
    assert "clickhouse" in clickhouse["extensions"]["jaeger_storage"]["backends"][store]
    # same listeners, so the compose file's ports hold whichever config JAEGER_CONFIG selects
    assert {port_of(e) for e in endpoints([clickhouse["receivers"], clickhouse["extensions"]])} == {
        port_of(e) for e in endpoints([memory["receivers"], memory["extensions"]])
    }
    (argument,) = SERVICES["jaeger"]["command"]
    assert (
        "${JAEGER_CONFIG:-config.yaml}" in argument
        and "./deploy/jaeger:/etc/jaeger:ro" in SERVICES["jaeger"]["volumes"]
    )


def test_no_metric_name_spells_its_unit() -> None:
    """Prometheus exporters append the unit (``_seconds``, ``_bytes``): a name that already says
    it reads twice (``ml_training_heartbeat_seconds_since_progress_seconds``)."""
    names = [
        value for key, value in vars(semconv).items() if key.startswith("METRIC_") and isinstance(value, str)
    ]
    assert names
    assert not [n for n in names if re.search(r"(^|[._])(seconds?|bytes?)([._]|$)", n)], names
