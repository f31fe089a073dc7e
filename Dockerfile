# One image for both roles: the web (daphne) and the GPU worker (celery); docker-compose.yml picks the command.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    DJANGO_SETTINGS_MODULE=playground.settings

WORKDIR /app

COPY requirements.txt .
# psycopg is only needed against PostgreSQL (compose); the embedded default uses SQLite.
RUN pip install -r requirements.txt "psycopg[binary]==3.3.9"

COPY manage.py ./
COPY playground ./playground
COPY inference ./inference
COPY kernels ./kernels
COPY templates ./templates
COPY static ./static

RUN useradd --create-home app && mkdir -p /models /app/var && chown app /models /app/var
USER app

EXPOSE 8000
CMD ["python", "manage.py", "web", "--host", "0.0.0.0", "--port", "8000"]
