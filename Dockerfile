# spemusic: a slim CPU image with the shipped models.
#   docker build -t spemusic .
#   docker run --rm -v "$PWD:/work" spemusic generate --length 4096 -o song.mid
#   docker run --rm -v "$PWD:/work" spemusic generate --bars 16 --audio -o song.mid
# Audio (render, --audio) uses the General MIDI SoundFont that pretty_midi ships, TimGM6mb
# (Tim Brechbill, GPL-2.0, 6 MB): it is inside the image already. For a fuller one, mount it and
# point SPEMUSIC_SOUNDFONT at it: -v /usr/share/sounds/sf2:/sf2 -e SPEMUSIC_SOUNDFONT=/sf2/FluidR3_GM.sf2
# Builder: a virtual environment with CPU-only torch first, then spemusic and its dependencies.
FROM debian:bookworm-slim AS builder
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0+cpu
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/spemusic
ENV PATH=/opt/spemusic/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# torch from the CPU index, its dependencies (filelock, sympy, …) from PyPI
RUN pip install --extra-index-url "$TORCH_INDEX_URL" "torch==${TORCH_VERSION}"
COPY pyproject.toml README.md LICENSE /src/
COPY spemusic /src/spemusic
COPY checkpoints /src/checkpoints
# torch is already there: the package's `torch>=2.3` adds nothing, so no CUDA build is pulled
RUN pip install /src \
    && find /opt/spemusic -name '__pycache__' -type d -prune -exec rm -rf {} + \
    && python -c "import torch; assert not torch.version.cuda"

# Runtime: Debian's python3 and the virtual environment, nothing else.
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --user-group --create-home --home-dir /home/spemusic spemusic \
    && mkdir /work \
    && chown 10001:10001 /work
COPY --from=builder /opt/spemusic /opt/spemusic
ENV PATH=/opt/spemusic/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
# mount your files here: docker run -v "$PWD:/work" spemusic …
WORKDIR /work
ENTRYPOINT ["spemusic"]
CMD ["--help"]
