"""The run path: consume → consume window → decode → the engine → records → publish → offsets.
`app.SentimentWorker` is the one place that wires these stages and owns their lifecycle; tokenization, the
batch plan and the model lanes are the engine's (`worker.inference`), which the window is submitted to.

Modules, in the order a message meets them: `consumer` (group member, rebalances, commits),
`consume_window` (when a window is due) and `window_shape` (its size on the device), `decode`
(bytes → review or dead-letter reason; `registry_decode` and `wire_format` for Avro, JSON Schema and
Protobuf values through a Schema Registry: `registry_client` asks it, `avro_values`, `json_schema_values` and
`protobuf_values` read each format within `registry_limits`), `windows` (a window's records in input
order), `records` and `producer` (results, dead letters, delivery reports; `result_encoding`: a result's
bytes in the output format), `publisher` (sends a window's records, takes the delivery reports in:
accounting, too-large stand-ins, the first failure), `checkpoint` (what may be committed, one per delivery
mode: stored offsets or the transaction), `offsets`
and `partitions` (per-partition bookkeeping), `backpressure`, `lag_clock` and `lag_gauges` (lag in messages
and seconds), `run_tracker` (stop conditions, the run's summary), `kafka_clients` (opening the producer and
consumer, topics, transactions at start). The loop's named helpers share a `loop_context`: `assignment`
(rebalance callbacks, pausing), `recovery` (rewinds, exactly_once's recovery), `registry_wait`,
`undecodable_inputs` (carrying out `undecodable`'s decisions), `loop_observer` (gauges, broker check,
progress), `port` (the HTTP port). Health and metrics are `worker.health` and `worker.metrics`, shared with
the HTTP serving.

The HTTP serving of the same model is `worker.http`: this package never imports it (with http_api, `run`
hands the worker its API, `app.PortApi`, which `worker.http.serving.WorkerApi` is).
"""

from worker.kafka.app import SentimentWorker
from worker.kafka.partitions import PartitionBook, PartitionKey
from worker.kafka.run_tracker import RunSummary, RunTracker

__all__ = [
    "PartitionBook",
    "PartitionKey",
    "RunSummary",
    "RunTracker",
    "SentimentWorker",
]
