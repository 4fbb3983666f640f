"""A compose file's one service (polar.rollout.compose), rule 4 (pure: no docker, no sockets, no processes).

4.x  one service built or run as its image, keys we do not read skipped, the rest refused in one line
"""

from __future__ import annotations

import pytest

from polar.rollout.images.compose import ComposeService, compose_service
from tests.rollout.test_image_refs import refused

pytestmark = pytest.mark.unit

# 4.x compose files

TERMINAL_BENCH = """\
# from a Terminal-Bench task
services:
  client:
    build:
      dockerfile: Dockerfile
    image: ${T_BENCH_TASK_DOCKER_CLIENT_IMAGE_NAME}
    container_name: ${T_BENCH_TASK_DOCKER_CLIENT_CONTAINER_NAME}
    command: [ "sh", "-c", "sleep infinity" ]
    environment:
      - TEST_DIR=${T_BENCH_TEST_DIR}
    volumes:
      - ${T_BENCH_TASK_LOGS_PATH}:${T_BENCH_CONTAINER_LOGS_PATH}
    healthcheck:
      test: |
        services:
          other: {}
      interval: 5s
"""


def test_4_1_a_terminal_bench_compose_file_is_built_from_its_dockerfile():
    assert compose_service(TERMINAL_BENCH) == ComposeService(
        "client", ".", "Dockerfile", "${T_BENCH_TASK_DOCKER_CLIENT_IMAGE_NAME}")
    assert compose_service(TERMINAL_BENCH).builds


@pytest.mark.parametrize("text,expected", [
    ("services:\n  app:\n    build: .\n", ("app", ".", "Dockerfile", None)),
    ("services:\n  app:\n    build: ./docker/  # the context\n", ("app", "docker", "docker/Dockerfile", None)),
    ("services:\n  app:\n    build:\n      context: sub\n      dockerfile: Dockerfile.dev\n",
     ("app", "sub", "sub/Dockerfile.dev", None)),
    ("services:\n  app:\n    build:\n      context: sub\n      dockerfile: ../Dockerfile\n",
     ("app", "sub", "Dockerfile", None)),
    ("version: '3.8'\nservices:\n    'app':\n        image: \"python:3.12-slim\"\n",
     ("app", None, None, "python:3.12-slim")),
    ("---\nname: x\nservices:\n  app:\n    image: ghcr.io/o/i:1 # pinned\nnetworks:\n  default: {}\n",
     ("app", None, None, "ghcr.io/o/i:1")),
    ("x-common: &common\n  a: 1\nservices:\n  main:\n    image: 'ubuntu:22.04'\n    ports:\n    - 80:80\n",
     ("main", None, None, "ubuntu:22.04")),
])
def test_4_2_one_service_built_or_run_as_its_image(text, expected):
    assert compose_service(text) == ComposeService(*expected)


@pytest.mark.parametrize("text,start", [
    ("services:\n  a:\n    image: x\n  b:\n    image: y\n",
     "compose file line 1: it has 2 services (a, b); polar-rollout runs one; reduce it to one service, or write "
     "environment/Dockerfile"),
    ("services:\n", "compose file line 1: it has 0 services (none);"),
    ("version: '3'\n", "compose file: it has no `services`;"),
    ("services: {app: {image: x}}\n", "compose file line 1: `services` is not a block mapping;"),
    ("include:\n  - other.yaml\nservices:\n  a:\n    image: x\n", "compose file line 1: `include` is not read;"),
    ("services:\n  a:\n    extends: base\n", "compose file line 3: service a uses `extends`;"),
    ("services:\n  a:\n    <<: *common\n", "compose file line 3: service a uses `<<`;"),
    ("services:\n  a:\n    ports: [80]\n", "compose file line 2: service a has neither build nor image;"),
    ("services:\n  a:\n    image: ${IMG}\n", "compose file line 3: service a's image '${IMG}' uses a variable;"),
    ("services:\n  a:\n    image: Bad\n", "compose file line 3: image reference 'Bad':"),
    ("services:\n  a:\n    image: *alias\n", "compose file line 3: service a's image uses YAML beyond the subset"),
    ("services:\n  a:\n    build: {context: .}\n", "compose file line 3: service a's build uses YAML beyond"),
    ("services:\n  a:\n    build:\n      context: .\n      args:\n        X: 1\n",
     "compose file line 5: build.args is not read (only build.context and build.dockerfile); remove build.args"),
    ("services:\n  a:\n    build:\n      dockerfile_inline: FROM x\n", "compose file line 4: build.dockerfile_inline"),
    ("services:\n  a:\n    build: /abs\n", "compose file line 3: the build context '/abs' is not a relative path"),
    ("services:\n  a:\n    build: https://github.com/o/r.git\n", "compose file line 3: the build context 'https:"),
    ("services:\n  a:\n    build: ..\n", "compose file line 3: the build context '..' lies outside environment/"),
    ("services:\n  a:\n    build:\n      dockerfile: ../../D\n",
     "compose file line 4: the build dockerfile '../../D' lies outside environment/"),
    ("services:\n  a:\n    build: ${CTX}\n", "compose file line 3: the build context '${CTX}' uses a variable"),
    ("services:\n  a:\n    image: x\n---\nservices: {}\n", "compose file line 4: it holds more than one YAML document"),
    ("services:\n\ta:\n", "compose file line 2: it is indented with a tab"),
    ("services:\n  a:\n    image: x\n    image: y\n", "compose file line 4: service a holds the key 'image' twice"),
    ("services:\n  a:\n    image: x\n   build: .\n", "compose file line 4: its indentation does not match"),
    ("services:\n  - a\n", "compose file line 2: '- a' in services is not a `key: value` line"),
    ("services:\n  a:\n    image: \"x\n", "compose file line 3: service a's image's quoted string is not closed"),
])
def test_4_3_everything_outside_the_subset_is_refused_in_one_line(text, start):
    assert refused(compose_service, text).startswith(start)


def test_4_4_errors_name_the_file():
    assert refused(compose_service, "services:\n", "environment/compose.yaml").startswith(
        "environment/compose.yaml line 1: it has 0 services")
