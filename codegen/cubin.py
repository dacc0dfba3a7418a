"""What a cubin exports: the kernel entry points in its ELF symbol table, read without a GPU.

NVRTC compiles whatever it is given: a source cut short compiles to a cubin without the
kernel, and a cache entry may hold any bytes. Checking that the cubin defines a global
function of the expected name, before it is stored or loaded, keeps such a cubin from
ever standing in for a kernel. Only the ELF header, section headers and symbol tables are
read, each bounds-checked, so damaged bytes raise :class:`CubinError`, never IndexError.
"""

from __future__ import annotations

import struct

EM_CUDA = 190  # e_machine of a CUDA cubin
_SHT_SYMTAB = 2
_STT_FUNC = 2
_STB_GLOBAL = 1
_SHN_UNDEF = 0
_EIFMT_NVAL, _EIFMT_SVAL = 1, 4  # .nv.info record formats: no value, sized value (else a 16-bit value)
_EIATTR_PARAM_CBANK_SIZE = 0x19
_EIATTR_KPARAM_INFO = 0x17
_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym: name, info, other, shndx, value, size
_SECTION = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr


class CubinError(ValueError):
    """The bytes are not a readable 64-bit little-endian CUDA ELF."""


def entry_points(cubin: bytes) -> frozenset[str]:
    """Names of the global functions the cubin defines (its kernels' extern "C" entry points)."""
    sections = _sections(cubin)
    names: set[str] = set()
    for _, kind, _, _, offset, size, link, _, _, entry_size in sections:
        if kind != _SHT_SYMTAB:
            continue
        if entry_size != _SYMBOL.size or link >= len(sections):
            raise CubinError("malformed symbol table")
        strings = sections[link]
        for start in range(offset, offset + size - _SYMBOL.size + 1, _SYMBOL.size):
            name, info, _, index, _, _ = _unpack(_SYMBOL, cubin, start)
            if info >> 4 == _STB_GLOBAL and info & 0xF == _STT_FUNC and index != _SHN_UNDEF:
                names.add(_string(cubin, strings[4] + name, strings[4] + strings[5]))
    return frozenset(names)


def _sections(cubin: bytes) -> list[tuple[int, ...]]:
    """The section headers of a 64-bit little-endian CUDA ELF."""
    if len(cubin) < 64 or cubin[:4] != b"\x7fELF":
        raise CubinError("not an ELF file")
    if cubin[4] != 2 or cubin[5] != 1:
        raise CubinError("not a 64-bit little-endian ELF file")
    (machine,) = struct.unpack_from("<H", cubin, 18)
    if machine != EM_CUDA:
        raise CubinError(f"ELF machine {machine}, not CUDA ({EM_CUDA})")
    (section_offset,) = struct.unpack_from("<Q", cubin, 40)
    section_size, section_count = struct.unpack_from("<HH", cubin, 58)
    if section_size != _SECTION.size:
        raise CubinError(f"section header size {section_size}, expected {_SECTION.size}")
    return [_unpack(_SECTION, cubin, section_offset + i * _SECTION.size) for i in range(section_count)]


def _info_value(info: bytes, attribute: int) -> int | None:
    """The 16-bit value of ``attribute`` in a ``.nv.info`` record list: each record is a format
    byte, an attribute byte and 16 bits (unused, a value, or the length of the bytes that
    follow)."""
    at = 0
    while at + 4 <= len(info):
        form, kind, value = struct.unpack_from("<BBH", info, at)
        at += 4
        if form == _EIFMT_SVAL:
            at += value
        elif form != _EIFMT_NVAL and kind == attribute:
            return int(value)
    return None


def parameter_bytes(cubin: bytes, name: str) -> int | None:
    """Bytes of parameters the kernel ``name`` takes: its parameter bank's size
    (EIATTR_PARAM_CBANK_SIZE of its ``.nv.info.<name>`` section) from the first parameter's
    offset (EIATTR_KPARAM_INFO; a 64-byte aligned first parameter, a tensor map, starts past
    the bank's base), or None where the cubin does not say."""
    sections = _sections(cubin)
    (names_index,) = struct.unpack_from("<H", cubin, 62)
    if names_index >= len(sections):
        raise CubinError("no section name table")
    names = sections[names_index]
    for section in sections:
        if _string(cubin, names[4] + section[0], names[4] + names[5]) == f".nv.info.{name}":
            info = cubin[section[4] : section[4] + section[5]]
            size = _info_value(info, _EIATTR_PARAM_CBANK_SIZE)
            return None if size is None else size - min(_parameter_offsets(info), default=0)
    return None


def _parameter_offsets(info: bytes) -> list[int]:
    """The bank offset of each parameter (EIATTR_KPARAM_INFO records: index, ordinal, offset, flags)."""
    offsets, at = [], 0
    while at + 4 <= len(info):
        form, kind, value = struct.unpack_from("<BBH", info, at)
        at += 4
        if form == _EIFMT_SVAL:
            if kind == _EIATTR_KPARAM_INFO and value >= 12 and at + 12 <= len(info):
                offsets.append(struct.unpack_from("<IHH", info, at)[2])
            at += value
    return offsets


def exports(cubin: bytes, name: str) -> bool:
    """True when ``cubin`` is a CUDA ELF that defines the kernel ``name``."""
    try:
        return name in entry_points(cubin)
    except CubinError:
        return False


def _unpack(layout: struct.Struct, data: bytes, offset: int) -> tuple[int, ...]:
    if offset < 0 or offset + layout.size > len(data):
        raise CubinError(f"truncated: a header at byte {offset} runs past the end ({len(data)} bytes)")
    return layout.unpack_from(data, offset)


def _string(data: bytes, start: int, stop: int) -> str:
    stop = min(stop, len(data))
    end = data.find(b"\0", start, stop)
    if start >= stop or end < 0:
        raise CubinError(f"a symbol name at byte {start} runs past its string table")
    return data[start:end].decode("utf-8", "replace")
