# A stand-in for the official redis image, built from Debian's packages where no registry answers (the
# compose smoke test): redis-server and redis-cli on PATH, the server run by compose's command.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update && apt-get install -y --no-install-recommends redis-server && rm -rf /var/lib/apt/lists/*
USER redis
EXPOSE 6379
CMD ["redis-server", "--protected-mode", "no"]
