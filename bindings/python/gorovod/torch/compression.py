"""Gradient compression for allreduce: Compression.none and Compression.fp16,
as in Horovod."""

import torch


class Compressor(object):
    """Turns a tensor into what travels, and back."""

    @staticmethod
    def compress(tensor):
        """Returns the tensor to send and what decompress needs."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        """Returns the received tensor as the caller's."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Sends tensors as they are."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class FP16Compressor(Compressor):
    """Sends floating-point tensors as float16 (half the bytes) and casts the
    result back; other tensors travel as they are."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
            return tensor.to(torch.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        if ctx is not None:
            return tensor.to(ctx)
        return tensor


class Compression(object):
    """The compression algorithms an allreduce may use."""
    none = NoneCompressor
    fp16 = FP16Compressor
