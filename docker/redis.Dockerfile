# Redis from Debian's redis-server, for machines that cannot pull redis:7 (make images).
#   docker build --network host --build-arg BASE_IMAGE=pyrsia-base:bookworm \
#       -t pyrsia-redis:bookworm - < docker/redis.Dockerfile
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
RUN apt-get update && apt-get install -y --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/*
EXPOSE 6379
# docker-compose.yml gives the command (redis-server ...), as it does to redis:7
CMD ["redis-server", "--bind", "0.0.0.0", "--protected-mode", "no", "--save", "", "--appendonly", "no"]
