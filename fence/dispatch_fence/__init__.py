"""dispatch-fence: publish checkpoints so that a late save from a superseded
execution (a lower DISPATCH_EPOCH) can never overwrite a newer one.

    from dispatch_fence import checkpoint
    checkpoint.publish(staging_dir, "/ckpt")               # a POSIX root: standard library only
    checkpoint.publish(staging_dir, "s3://bucket/ckpt")    # needs the [s3] extra
    checkpoint.publish(staging_dir, "gs://bucket/ckpt")    # needs the [gcs] extra

This file stays a docstring: importing the package imports nothing.
"""
