"""The worker's settings: one frozen `WorkerSettings`, read once at start-up (`load_settings`), whose
sections (`settings.sections.kafka`, `.delivery`, `.registry`, `.http`, `.batching`, `.model`, `.security`,
`.observability`, `.limits`) are what each part of the worker takes.

    fields     the flat fields users give (SENTIMENT_* variables, config-file keys): types, defaults, docs
    settings   WorkerSettings: the rules across fields, the sources' order, the sections built once
    sections   the frozen sections and the librdkafka properties of kafka + security
    sources    the config file, load_settings, and the start-up warnings about the environment
"""

from worker.config.fields import (
    DEFAULT_LOW_CONFIDENCE,
    DEFAULT_MODEL_DIR,
    ENV_PREFIX,
    REGISTRY_FORMATS,
    SettingsFields,
)
from worker.config.sections import (
    LIBRDKAFKA_LOGGER,
    BatchingSettings,
    DeliverySettings,
    HttpSettings,
    KafkaSettings,
    LimitsSettings,
    LiveModelsSettings,
    ModelSettings,
    ObservabilitySettings,
    RegistrySettings,
    Sections,
    SecuritySettings,
    build_sections,
    librdkafka_common,
)
from worker.config.settings import (
    KAFKA_EXTRA_GUARDED_ONE_SETTING,
    WorkerSettings,
    kafka_extra_overrides,
    split_user_info,
)
from worker.config.sources import (
    JSON_EXAMPLES,
    OTHER_ENVIRONMENT,
    environment_warnings,
    load_settings,
    read_config_file,
    setting_origin,
)

__all__ = [
    "DEFAULT_LOW_CONFIDENCE",
    "DEFAULT_MODEL_DIR",
    "ENV_PREFIX",
    "JSON_EXAMPLES",
    "KAFKA_EXTRA_GUARDED_ONE_SETTING",
    "LIBRDKAFKA_LOGGER",
    "OTHER_ENVIRONMENT",
    "REGISTRY_FORMATS",
    "BatchingSettings",
    "DeliverySettings",
    "HttpSettings",
    "KafkaSettings",
    "LimitsSettings",
    "LiveModelsSettings",
    "ModelSettings",
    "ObservabilitySettings",
    "RegistrySettings",
    "Sections",
    "SecuritySettings",
    "SettingsFields",
    "WorkerSettings",
    "build_sections",
    "environment_warnings",
    "setting_origin",
    "kafka_extra_overrides",
    "librdkafka_common",
    "load_settings",
    "read_config_file",
    "split_user_info",
]
