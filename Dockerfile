# One image for the API and the workers (`cahp serve` / `cahp worker`), running as a non-root user.
#
#   docker build -t cahp .                                   # torch from PyPI (bundles CUDA; GPU workers)
#   docker build -t cahp-cpu --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu .
#
# GPU workers need the NVIDIA Container Toolkit on the host; the image brings its own CUDA runtime
# through the torch wheel, so only the driver comes from the host.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin cahp \
    && mkdir -p /data \
    && chown cahp:cahp /data

WORKDIR /opt/cahp

# Dependencies first, from pyproject.toml alone, so editing the code does not reinstall torch; every one
# at the exact version of constraints.txt (what the test suite ran against), not the newest in its range.
ARG TORCH_INDEX_URL=""
COPY pyproject.toml README.md constraints.txt ./
RUN mkdir -p cahp_engine app worker migrations \
    && touch cahp_engine/__init__.py app/__init__.py worker/__init__.py migrations/__init__.py \
    && if [ -n "$TORCH_INDEX_URL" ]; then pip install -c constraints.txt --index-url "$TORCH_INDEX_URL" torch; fi \
    && pip install -c constraints.txt ".[hub,mlflow]" \
    && pip uninstall -y cahp

COPY cahp_engine ./cahp_engine
COPY app ./app
COPY worker ./worker
COPY migrations ./migrations
COPY alembic.ini ./
RUN pip install --no-deps .

USER cahp
# Embedded-mode state, the local artifact store and the Hugging Face cache live on one volume.
ENV CAHP_DATA_DIR=/data \
    HF_HOME=/data/hf-cache
VOLUME ["/data"]
EXPOSE 8000

CMD ["cahp", "serve", "--host", "0.0.0.0", "--port", "8000"]
