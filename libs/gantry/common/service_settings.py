"""What the three services' settings objects stand on: flags and configuration environment
variables resolved in one place, typed and validated by pydantic-settings.

Each service declares one `ServiceSettings` model (its `settings.py`). argparse still owns the
flag syntax and `--help` (pydantic-settings' own CLI cannot keep the help text, the argument
groups and the `parser.error` exits as they are); the model owns everything after it:

- a field holds its flag's value (the argparse `dest` is the field's name);
- a field that a configuration environment variable may set names that variable as its
  `validation_alias`, and ONLY such fields are read from the environment (a field without one,
  such as `listen`, ignores a stray LISTEN or DATABASE_URL);
- a flag given beats its variable, which beats the default; an empty flag or variable counts as
  not given;
- a bad value is one line naming where it came from, the flag or the variable (`SettingsError`):
  validators say what is wrong with a value, `from_flags` prefixes whoever supplied it.
"""

from __future__ import annotations

import argparse
from functools import partial
from typing import TYPE_CHECKING, Annotated, Any, Self, TypeVar

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    ValidationError,
    create_model,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from gantry.common.inference_limits import LIMIT_SETTINGS, InferenceLimits, limit_value
from gantry.common.json_logs import LOG_FORMAT_ENV
from gantry.common.process import LOG_LEVEL_ENV
from gantry.common.tls import (
    CA_ENV,
    CERT_ENV,
    CLIENT_CA_ENV,
    CLIENT_CERT_ENV,
    CLIENT_KEY_ENV,
    KEY_ENV,
    SCHEDULER_CA_ENV,
    SCHEDULER_CERT_ENV,
    SCHEDULER_KEY_ENV,
    SCHEDULER_SERVER_NAME_ENV,
    SERVER_NAME_ENV,
    ClientTls,
    ServerTls,
    TlsSettingsError,
    client_tls_of,
    server_tls_of,
)


class SettingsError(ValueError):
    """A flag or configuration variable that cannot work: one line naming it (exit status 2)."""


def _must_be_positive(value: float) -> float:
    if value <= 0:  # a NaN passes, as it always has: `nan <= 0` is false
        raise ValueError("must be positive")
    return value


# A float flag checked above 0 after parsing (the control plane's intervals and lease).
PositiveFloat = Annotated[float, AfterValidator(_must_be_positive)]


class _DeclaredEnvironment(EnvSettingsSource):
    """The environment, read only for fields that name their variable (`validation_alias`)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        if not isinstance(field.validation_alias, str):
            return None, field_name, False
        return super().get_field_value(field, field_name)


class ServiceSettings(BaseSettings):
    """One service's flags and configuration variables, resolved and checked together."""

    model_config = SettingsConfigDict(case_sensitive=True, env_ignore_empty=True, frozen=True)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The flags (passed as init values) first, then the declared variables; no .env file
        # and no secrets directory: nothing configures a service that its docs do not name.
        return init_settings, _DeclaredEnvironment(
            settings_cls, case_sensitive=True, env_ignore_empty=True
        )

    @classmethod
    def from_flags(cls, args: argparse.Namespace) -> Self:
        """The settings from parsed flags and the environment; SettingsError names the flag or
        variable whose value is wrong, or says which values do not go together."""
        given: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for name, field in cls.model_fields.items():
            key = field.validation_alias if isinstance(field.validation_alias, str) else name
            value = getattr(args, name, None)
            if value is None or value == "":
                sources[key] = key  # the variable's, else the default (always valid)
                continue
            given[key] = value
            sources[key] = f"--{name.replace('_', '-')}"
        try:
            return cls(**given)
        except ValidationError as exc:
            raise SettingsError(_first_problem(exc, sources)) from None

    def tls_in_use(self) -> tuple[ServerTls | ClientTls, ...]:
        """Every TLS setting this service will use (each TLS mixin adds its own)."""
        return ()


SettingsT = TypeVar("SettingsT", bound=ServiceSettings)


def parse_settings(
    parser: argparse.ArgumentParser, model: type[SettingsT], argv: list[str] | None
) -> SettingsT:
    """A service's settings from its command line and the environment, with every TLS file read
    now rather than at the first connection; anything wrong exits through `parser.error`
    (status 2), in one line naming the flag or variable."""
    try:
        settings = model.from_flags(parser.parse_args(argv))
        for tls in settings.tls_in_use():
            tls.credentials()
    except (SettingsError, TlsSettingsError) as exc:
        parser.error(str(exc))
    return settings


def _first_problem(exc: ValidationError, sources: dict[str, str]) -> str:
    error = exc.errors()[0]
    cause = error.get("ctx", {}).get("error")
    # A validator's own ValueError says it best (pydantic would prefix "Value error, ").
    problem = str(cause) if isinstance(cause, Exception) else error["msg"]
    if not error["loc"]:  # values that do not go together: the message names them
        return problem
    key = str(error["loc"][0])
    return f"{sources.get(key, key)} {problem}"


# ---- the settings more than one service shares --------------------------------------------------


class ProcessSettings(ServiceSettings):
    """What every service's process sets up first: its logs (`add_log_format_argument`) and
    its metrics endpoint (`add_metrics_argument`)."""

    log_format: str | None = None
    log_format_variable: str | None = Field(None, validation_alias=LOG_FORMAT_ENV)
    log_level: str | None = Field(None, validation_alias=LOG_LEVEL_ENV)
    metrics_address: str | None = None

    def logging_environment(self) -> dict[str, str]:
        """The logging variables as `setup_logging` reads them (its one rule for a misspelt
        format, shared with the model host, stays there)."""
        chosen = {LOG_FORMAT_ENV: self.log_format_variable, LOG_LEVEL_ENV: self.log_level}
        return {name: value for name, value in chosen.items() if value is not None}


class ServerTlsSettings(ServiceSettings):
    """This server's TLS (`add_server_tls_arguments`): plaintext unless a certificate is set."""

    tls_cert: str | None = Field(None, validation_alias=CERT_ENV)
    tls_key: str | None = Field(None, validation_alias=KEY_ENV)
    tls_client_ca: str | None = Field(None, validation_alias=CLIENT_CA_ENV)

    @model_validator(mode="after")
    def _server_tls_goes_together(self) -> Self:
        self.server_tls()
        return self

    def tls_in_use(self) -> tuple[ServerTls | ClientTls, ...]:
        own = self.server_tls()
        return (*((own,) if own is not None else ()), *super().tls_in_use())

    def server_tls(self) -> ServerTls | None:
        return server_tls_of(cert=self.tls_cert, key=self.tls_key, client_ca=self.tls_client_ca)


class ClientTlsSettings(ServiceSettings):
    """The worker's TLS to the control plane (`add_client_tls_arguments`, CLIENT_TLS)."""

    tls_ca: str | None = Field(None, validation_alias=CA_ENV)
    tls_cert: str | None = Field(None, validation_alias=CLIENT_CERT_ENV)
    tls_key: str | None = Field(None, validation_alias=CLIENT_KEY_ENV)
    tls_server_name: str | None = Field(None, validation_alias=SERVER_NAME_ENV)

    @model_validator(mode="after")
    def _client_tls_goes_together(self) -> Self:
        self.client_tls()
        return self

    def tls_in_use(self) -> tuple[ServerTls | ClientTls, ...]:
        own = self.client_tls()
        return (*((own,) if own is not None else ()), *super().tls_in_use())

    def client_tls(self) -> ClientTls | None:
        return client_tls_of(
            ca=self.tls_ca, cert=self.tls_cert, key=self.tls_key, server_name=self.tls_server_name
        )


class SchedulerTlsSettings(ServiceSettings):
    """The control plane's TLS to the scheduler (`add_client_tls_arguments`,
    SCHEDULER_CLIENT_TLS)."""

    scheduler_tls_ca: str | None = Field(None, validation_alias=SCHEDULER_CA_ENV)
    scheduler_tls_cert: str | None = Field(None, validation_alias=SCHEDULER_CERT_ENV)
    scheduler_tls_key: str | None = Field(None, validation_alias=SCHEDULER_KEY_ENV)
    scheduler_tls_server_name: str | None = Field(None, validation_alias=SCHEDULER_SERVER_NAME_ENV)

    @model_validator(mode="after")
    def _scheduler_tls_goes_together(self) -> Self:
        self.scheduler_tls()
        return self

    def tls_in_use(self) -> tuple[ServerTls | ClientTls, ...]:
        own = self.scheduler_tls()
        return (*((own,) if own is not None else ()), *super().tls_in_use())

    def scheduler_tls(self) -> ClientTls | None:
        return client_tls_of(
            ca=self.scheduler_tls_ca,
            cert=self.scheduler_tls_cert,
            key=self.scheduler_tls_key,
            server_name=self.scheduler_tls_server_name,
        )


class _InferenceLimitValues(ServiceSettings):
    """The limits on one Inference call (`add_limit_arguments`): one field per LIMIT_SETTINGS
    entry, declared from that table below; None where neither flag nor variable sets it."""

    @model_validator(mode="after")
    def _limits_go_together(self) -> Self:
        self.inference_limits()
        return self

    def inference_limits(self) -> InferenceLimits:
        chosen = {setting.field: getattr(self, setting.field) for setting in LIMIT_SETTINGS}
        return InferenceLimits(
            **{name: value for name, value in chosen.items() if value is not None}
        )


if TYPE_CHECKING:
    InferenceLimitSettings = _InferenceLimitValues
else:
    InferenceLimitSettings = create_model(
        "InferenceLimitSettings",
        __base__=_InferenceLimitValues,
        **{
            setting.field: (
                Annotated[int | None, BeforeValidator(partial(limit_value, setting))],
                Field(None, validation_alias=setting.env),
            )
            for setting in LIMIT_SETTINGS
        },
    )
