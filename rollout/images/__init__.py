"""Task images: where a task's container comes from (`sources`: --image, a Dockerfile, a compose file, an image
reference), the references and --image-map (`refs`), a Dockerfile's and a compose file's reading (`dockerfile`,
`compose`), the environment phase that looks each task's image up or builds it (`environments`), the read-only
runtime we run inside any image (`runtime`), and the stand-in base images for machines without a registry
(`standins`, `standin_roots`)."""
