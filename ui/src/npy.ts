// A .npy reader for route arrays: integer dtypes (u1, u2, u4, i1, i2, i4, i8, u8), either byte
// order, C order; the header is checked against the data length. Format:
// https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html

export interface NpyArray {
  dtype: string; // e.g. "<u2"
  shape: number[];
  data: Int32Array | Float64Array; // ids widened; Float64Array only for 64-bit values past int32
}

const MAGIC = [0x93, 0x4e, 0x55, 0x4d, 0x50, 0x59]; // \x93NUMPY

export function isNpy(bytes: Uint8Array): boolean {
  return bytes.length >= MAGIC.length && MAGIC.every((b, i) => bytes[i] === b);
}

function headerField(header: string, key: string): string {
  const match = new RegExp(`['"]${key}['"]\\s*:\\s*`).exec(header);
  if (!match) throw new Error(`.npy header has no '${key}'`);
  return header.slice(match.index + match[0].length);
}

export function parseNpy(bytes: Uint8Array): NpyArray {
  if (!isNpy(bytes)) throw new Error("not a .npy file (no \\x93NUMPY magic)");
  if (bytes.length < 10) throw new Error(".npy file is truncated");
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const major = bytes[6];
  let headerLength: number;
  let headerStart: number;
  if (major === 1) {
    headerLength = view.getUint16(8, true);
    headerStart = 10;
  } else if (major === 2 || major === 3) {
    if (bytes.length < 12) throw new Error(".npy file is truncated");
    headerLength = view.getUint32(8, true);
    headerStart = 12;
  } else {
    throw new Error(`unsupported .npy version ${major}`);
  }
  const dataStart = headerStart + headerLength;
  if (dataStart > bytes.length) throw new Error(".npy header runs past the end of the file");
  const header = new TextDecoder(major === 3 ? "utf-8" : "latin1").decode(
    bytes.subarray(headerStart, dataStart),
  );

  const descrMatch = /^['"]([<>|=])([iu])(\d)['"]/.exec(headerField(header, "descr"));
  if (!descrMatch) throw new Error(`unsupported dtype in .npy header (integers only): ${header.trim()}`);
  const [, order, kind, sizeText] = descrMatch;
  const itemSize = Number(sizeText);
  if (![1, 2, 4, 8].includes(itemSize)) throw new Error(`unsupported integer size ${itemSize}`);
  if (!/^(False)/.test(headerField(header, "fortran_order"))) {
    throw new Error("Fortran-ordered .npy arrays are not supported");
  }
  const shapeMatch = /^\(([^)]*)\)/.exec(headerField(header, "shape"));
  if (!shapeMatch) throw new Error("malformed shape in .npy header");
  const shape = shapeMatch[1]
    .split(",")
    .map((s) => s.trim())
    .filter((s) => s.length > 0)
    .map((s) => {
      if (!/^\d+$/.test(s)) throw new Error(`malformed shape entry '${s}' in .npy header`);
      return Number(s);
    });
  const count = shape.reduce((a, b) => a * b, 1);
  if (!Number.isSafeInteger(count) || count * itemSize > bytes.length - dataStart) {
    throw new Error(
      `.npy data is ${bytes.length - dataStart} bytes; shape (${shape.join(", ")}) needs ${count * itemSize}`,
    );
  }

  const little = order !== ">";
  const signed = kind === "i";
  const wide = itemSize === 8 || (itemSize === 4 && !signed);
  const data = wide ? new Float64Array(count) : new Int32Array(count);
  for (let i = 0, at = dataStart; i < count; ++i, at += itemSize) {
    let value: number;
    switch (itemSize) {
      case 1:
        value = signed ? view.getInt8(at) : view.getUint8(at);
        break;
      case 2:
        value = signed ? view.getInt16(at, little) : view.getUint16(at, little);
        break;
      case 4:
        value = signed ? view.getInt32(at, little) : view.getUint32(at, little);
        break;
      default:
        value = Number(signed ? view.getBigInt64(at, little) : view.getBigUint64(at, little));
    }
    data[i] = value;
  }
  return { dtype: `${order}${kind}${itemSize}`, shape, data };
}

export function base64ToBytes(text: string): Uint8Array {
  const clean = text.replace(/\s+/g, "");
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(clean)) throw new Error("not base64 text");
  const binary = atob(clean);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; ++i) bytes[i] = binary.charCodeAt(i);
  return bytes;
}
