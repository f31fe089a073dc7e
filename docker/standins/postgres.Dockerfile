# A stand-in for the official postgres image, built from Debian's packages where no registry answers (the
# compose smoke test). It honours the three variables compose sets: POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update && apt-get install -y --no-install-recommends postgresql-15 && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/lib/postgresql/data /run/postgresql \
    && chown postgres:postgres /var/lib/postgresql/data /run/postgresql
COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data
USER postgres
EXPOSE 5432
ENTRYPOINT ["sh", "/usr/local/bin/postgres-entrypoint.sh"]
