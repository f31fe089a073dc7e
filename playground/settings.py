"""Django settings, all overridable from the environment (see docs/protocol.md and the README).

Without REDIS_URL everything runs in one process (in-memory channel layer, Celery's in-memory broker,
local-memory cache). With REDIS_URL, channels-redis, a Redis broker and a Redis cache let web processes and
GPU workers on other machines meet.
"""
import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from .envconfig import database_from_url, env_bool, env_int, env_list, env_lora_modules, secret_key_file
from .logs import logging_config

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("PLAYGROUND_VAR_DIR", BASE_DIR / "var"))

# Off unless asked for (DEBUG=1): debug pages list every route and show tracebacks with local variables.
DEBUG = env_bool("DEBUG", False)
REDIS_URL = os.environ.get("REDIS_URL", "")
SECRET_KEY = os.environ.get("SECRET_KEY") or ""
if not SECRET_KEY:
    if REDIS_URL:  # several processes must share one key: the operator sets it
        raise ImproperlyConfigured("set SECRET_KEY in the environment: every web process and worker needs the same")
    SECRET_KEY = secret_key_file(VAR_DIR / "secret_key")  # one process: a random key, kept across restarts

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",  # first, so that `runserver` serves ASGI (websockets included)
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "playground.chat",
    "playground.serving",
    "playground.accounts",
    "playground.api",
    "playground.demo",
    "playground.lab",
    "playground.dashboard",
]

MIDDLEWARE = [
    "playground.security.ContentSecurityPolicyMiddleware",
    # Django's own, run on the event loop where they do no I/O (playground/middleware.py)
    "playground.middleware.SecurityMiddleware",
    "playground.middleware.SessionMiddleware",
    "playground.middleware.CommonMiddleware",
    "playground.middleware.CsrfViewMiddleware",
    "playground.middleware.AuthenticationMiddleware",
    "playground.middleware.MessageMiddleware",
    "playground.middleware.XFrameOptionsMiddleware",
]

# Sent with every response (playground/security.py, docs/security.md): the pages are plain ES modules and
# stylesheets from /static/, with no inline script or style, so nothing else needs to be allowed.
PLAYGROUND_CSP = "; ".join([
    "default-src 'self'", "script-src 'self'", "style-src 'self'", "img-src 'self' data:", "font-src 'self'",
    "connect-src 'self'", "object-src 'none'", "base-uri 'self'", "form-action 'self'", "frame-ancestors 'none'",
])
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"

ROOT_URLCONF = "playground.urls"
ASGI_APPLICATION = "playground.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

_DATABASE_URL = os.environ.get("DATABASE_URL")
if not _DATABASE_URL:
    VAR_DIR.mkdir(parents=True, exist_ok=True)
DATABASES = {"default": database_from_url(_DATABASE_URL, VAR_DIR / "playground.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"

# --- Redis: one URL (REDIS_URL, read above) switches the whole stack to distributed mode ---------------------

if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # channels-redis blocks 5 s per receive (BZPOPMIN); redis-py 8's default socket timeout is
            # about as long and would abort that read, so allow well more.
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 30}], "capacity": 1000, "expiry": 60},
        }
    }
    # One connection pool and client per process, not per request and call (playground/cache_pool.py).
    CACHES = {"default": {"BACKEND": "playground.cache_pool.RedisCache", "LOCATION": REDIS_URL,
                          "OPTIONS": {"pool_class": "playground.cache_pool.SharedConnectionPool"}}}
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "playground.serving.shared.memory_layer.EmbeddedChannelLayer",
                                  "CONFIG": {"capacity": 1000}}}
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# --- Celery (read by playground/celery.py with the CELERY_ prefix) ------------------------------------------
CELERY_BROKER_URL = REDIS_URL or "memory://"
if REDIS_URL:  # kombu's Redis transport, with one client per channel for its plain commands (playground/broker.py)
    CELERY_BROKER_TRANSPORT = "playground.broker:Transport"
# The in-memory transport polls. Embedded, the in-process worker takes generations itself (serving/embedded.py)
# and the broker carries only what it declines (while the worker starts or stops), so a look every half second
# is soon enough; at 10 ms the looks alone took ~0.2 s of CPU from the engine's cores per 15 s of serving.
CELERY_BROKER_TRANSPORT_OPTIONS = {} if REDIS_URL else {"polling_interval": 0.5}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_DEFAULT_QUEUE = "gpu"
# A task is acknowledged when a worker takes it: if that worker dies, the client gets an error, never a replay.
CELERY_TASK_ACKS_LATE = False
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# One process hosts one engine; its many in-flight requests are threads that wait on the shared batch.
CELERY_WORKER_POOL = "playground.serving.worker.pool:TaskPool"  # threads, all started at once
CELERY_WORKER_CONCURRENCY = env_int("PLAYGROUND_WORKER_CONCURRENCY", 64, minimum=1)
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_WORKER_SEND_TASK_EVENTS = False

# --- The playground ------------------------------------------------------------------------------------------
# Anonymous chat (conversations kept per session): on for the one-process default, off for a shared deployment
# unless its operator turns it on.
PLAYGROUND_ALLOW_ANONYMOUS = env_bool("PLAYGROUND_ALLOW_ANONYMOUS", not REDIS_URL)
# The OpenAI-compatible API without a key, for clients on this machine only (loopback addresses), under the
# anonymous limits, as vLLM's server without --api-key: on for the one-process default (playground/accounts/
# access.py, docs/security.md). Behind a reverse proxy on the same machine every client looks local: turn it off.
PLAYGROUND_API_KEYLESS = env_bool("PLAYGROUND_API_KEYLESS", not REDIS_URL and PLAYGROUND_ALLOW_ANONYMOUS)
PLAYGROUND_SERVE_STATIC = env_bool("PLAYGROUND_SERVE_STATIC", True)

# Server-side caps on what one generate frame or API body may ask for (also shown to the page as `limits`);
# the sampling fields, their ranges and defaults are in playground/serving/web/sampling.py.
PLAYGROUND_LIMITS = {
    "max_tokens": env_int("PLAYGROUND_MAX_TOKENS", 1024, minimum=1),
    "max_n": env_int("PLAYGROUND_MAX_N", 4, minimum=1),
    "max_stop": 4,
    "max_stop_length": 64,
    "max_messages": 200,
    "max_message_chars": 32_000,
    "max_frame_bytes": env_int("PLAYGROUND_MAX_FRAME_BYTES", 64 * 1024, minimum=1024),
    "max_json_depth": 32,  # arrays and objects nested deeper are refused before parsing (frames and API bodies)
}

# Per-user limits (defaults; a user's UserQuota in admin overrides them). 0 = unlimited.
PLAYGROUND_USER_LIMITS = {
    "max_concurrent_requests": env_int("PLAYGROUND_MAX_CONCURRENT_REQUESTS", 16, minimum=0),
    "tokens_per_minute": env_int("PLAYGROUND_TOKENS_PER_MINUTE", 0, minimum=0),
}
# Anonymous users (no account; a cookie-less client gets a new session per socket, so sessions cannot be
# what is limited): per client address, and a pool shared by every anonymous request of the server.
PLAYGROUND_ANONYMOUS_LIMITS = {
    "max_concurrent_requests_per_address": env_int(
        "PLAYGROUND_ANON_MAX_CONCURRENT_PER_ADDRESS", PLAYGROUND_USER_LIMITS["max_concurrent_requests"], minimum=0
    ),
    "max_concurrent_requests": env_int("PLAYGROUND_ANON_MAX_CONCURRENT", 64, minimum=0),
    "tokens_per_minute_per_address": env_int(
        "PLAYGROUND_ANON_TOKENS_PER_MINUTE_PER_ADDRESS", PLAYGROUND_USER_LIMITS["tokens_per_minute"], minimum=0
    ),
}
# The OpenAI-compatible API (docs/api.md).
PLAYGROUND_API = {
    "max_body_bytes": env_int("PLAYGROUND_API_MAX_BODY_BYTES", 1024 * 1024, minimum=1024),
    "max_prompt_chars": env_int("PLAYGROUND_MAX_PROMPT_CHARS", 32_000, minimum=1),
}
DATA_UPLOAD_MAX_MEMORY_SIZE = PLAYGROUND_API["max_body_bytes"]  # Django refuses larger bodies before reading them
# Per-user prefix-cache salt against the cross-user timing side channel: "off" or "user".
PLAYGROUND_CACHE_SALT = os.environ.get("PLAYGROUND_CACHE_SALT", "off").strip().lower()
if PLAYGROUND_CACHE_SALT not in ("off", "user"):
    raise ImproperlyConfigured(f"PLAYGROUND_CACHE_SALT={PLAYGROUND_CACHE_SALT!r}: use 'off' or 'user'")
# KV dashboard: a busy worker publishes a snapshot every this many ms (playground/serving/worker/kv_publisher.py).
PLAYGROUND_KV_SNAPSHOT_MS = env_int("PLAYGROUND_KV_SNAPSHOT_MS", 250, minimum=50)
# Demo mode: at most this many simulated users per run.
PLAYGROUND_DEMO_MAX_USERS = env_int("PLAYGROUND_DEMO_MAX_USERS", 32, minimum=1)

# Weight format of every GPU worker's model (inference.quantization): unset for float weights.
PLAYGROUND_QUANTIZATION = os.environ.get("PLAYGROUND_QUANTIZATION", "").strip().lower() or None
if PLAYGROUND_QUANTIZATION not in (None, "int8", "int4", "gguf", "awq", "gptq"):
    raise ImproperlyConfigured(f"PLAYGROUND_QUANTIZATION={PLAYGROUND_QUANTIZATION!r}: use int8, int4, gguf, awq, gptq "
                               "or leave it unset")

# Keyword arguments for inference.StreamingEngine in every GPU worker.
PLAYGROUND_ENGINE = {
    "model": os.environ.get("PLAYGROUND_MODEL", "smollm2-135m-instruct"),
    "device": os.environ.get("ENGINE_DEVICE", "auto"),
    "dtype": os.environ.get("ENGINE_DTYPE", "auto"),
    # Unset: what the model and the KV pool allow (inference.EngineArgs), reported back by each worker.
    "max_model_len": env_int("ENGINE_MAX_MODEL_LEN", None, minimum=16),
    "max_num_seqs": env_int("ENGINE_MAX_NUM_SEQS", 64, minimum=1),
    "num_kv_blocks": env_int("ENGINE_NUM_KV_BLOCKS", None, minimum=1),
    "enable_prefix_caching": env_bool("ENGINE_PREFIX_CACHING", True),
    "seed": env_int("ENGINE_SEED", 0),
    "quantization": PLAYGROUND_QUANTIZATION,
    # Split the model over this many devices (inference/parallel/): N rank processes per worker.
    "tensor_parallel_size": env_int("PLAYGROUND_TENSOR_PARALLEL_SIZE", 1, minimum=1),
}
# LoRA adapters served beside the base model (vLLM's --lora-modules): PLAYGROUND_LORA_MODULES=name=path,...
# A request selects one with `model: "<name>"` (API) or the chat page's model picker.
PLAYGROUND_LORA_MODULES = env_lora_modules("PLAYGROUND_LORA_MODULES", PLAYGROUND_ENGINE["model"])
if PLAYGROUND_LORA_MODULES:
    PLAYGROUND_ENGINE.update(enable_lora=True, max_loras=env_int("ENGINE_MAX_LORAS", 4, minimum=1),
                             max_lora_rank=env_int("ENGINE_MAX_LORA_RANK", 64, minimum=1))

# Streaming and liveness timings (seconds unless named _ms).
# The lab's sandboxes (playground.serving.worker.lab_host): per worker, and closed after this long unused.
PLAYGROUND_LAB = {
    "idle_s": float(env_int("PLAYGROUND_LAB_IDLE_S", 900, minimum=10)),
    "max_sessions": env_int("PLAYGROUND_LAB_MAX_SESSIONS", 4, minimum=0),
}
PLAYGROUND_LAB_REPLY_TIMEOUT_S = 30.0  # a lab page gets an error when its worker has not answered by then
PLAYGROUND_COALESCE_MS = env_int("PLAYGROUND_COALESCE_MS", 30, minimum=0)
# The chat page's text events (websocket frames) a worker sends per second in all while many stream; 0: one per
# COALESCE_MS each (serving/worker/coalesce.py). Each frame costs the web side ~0.2-0.3 ms of a core, so this is
# a CPU budget: 125 a second is ~3-4% of one core, taken from the engine's on the embedded stack.
PLAYGROUND_WS_FRAMES_PER_S = env_int("PLAYGROUND_WS_FRAMES_PER_S", 125, minimum=0)
PLAYGROUND_HEARTBEAT_INTERVAL = 1.0  # a worker refreshes its registry entry this often
# ...and is considered gone when it has not for this long (raise it on a CPU host so loaded that a worker's
# heartbeat thread can starve behind its engine for seconds).
PLAYGROUND_HEARTBEAT_TTL = float(env_int("PLAYGROUND_HEARTBEAT_TTL", 4, minimum=2))
PLAYGROUND_ACCEPT_TIMEOUT = env_int("PLAYGROUND_ACCEPT_TIMEOUT", 120, minimum=1)  # queued, never picked up
PLAYGROUND_NO_WORKER_GRACE = 8.0  # no live worker at all for this long -> error
# Every accepted request ends (reply or error) within this many seconds of its admission.
PLAYGROUND_REQUEST_DEADLINE_S = env_int("PLAYGROUND_REQUEST_DEADLINE_S", 600, minimum=1)
# On SIGTERM a worker drains: it tells the registry at once, finishes what it holds within this many seconds,
# then cuts the rest with an error frame (docker-compose.yml's stop_grace_period must stay above it).
PLAYGROUND_DRAIN_S = env_int("PLAYGROUND_DRAIN_S", 30, minimum=0)
# A worker's heartbeats lists the requests it serves; unlisted this long without a `gen.done`: the reply was lost.
PLAYGROUND_LOST_REPLY_GRACE = 3.0

# PLAYGROUND_LOG_FORMAT=json: one JSON object a line, each with its request id (playground/logs.py).
PLAYGROUND_LOG_FORMAT = os.environ.get("PLAYGROUND_LOG_FORMAT", "text")
LOGGING = logging_config(PLAYGROUND_LOG_FORMAT, os.environ.get("LOG_LEVEL", "INFO"))
# Celery's worker would replace the root logger's handlers with its own plain format.
CELERY_WORKER_HIJACK_ROOT_LOGGER = PLAYGROUND_LOG_FORMAT != "json"
