// Package key builds bucket keys: a rule's id and version and the values of its key
// attributes, each escaped so that no two different tuples give the same key, bounded in length,
// and with the Redis hash tag (the caller's identity) in braces that no value can forge.
//
// Layout: sl:<rule>:<version>[:{<tag>}]:<part>:<part>...
// API keys are hashed (AppendSecret); other values reach the store in plain text.
package key

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// MaxPart is the longest escaped part kept verbatim; a longer value is replaced by '#' and the
// hex of its SHA-256 (128 bits), so a key stays short whatever the caller sends.
const MaxPart = 96

// Prefix starts every bucket key, so Sluice's keys are easy to find and to keep apart from
// other users of a shared Redis.
const Prefix = "sl:"

// escapes maps the bytes that carry structure to the letter of their escape: ':' separates
// parts, '{' and '}' delimit the Redis hash tag, '#' marks a hashed part, '\' escapes. Other
// bytes map to 0.
var escapes = [256]byte{':': 'c', '{': 'o', '}': 'x', '#': 'h', '\\': '\\'}

func escapedLen(v string) int {
	n := len(v)
	for i := 0; i < len(v); i++ {
		if escapes[v[i]] != 0 {
			n++
		}
	}
	return n
}

// needsEscape reports whether v holds a byte that escapes: the OR of every byte's escape
// letter, with no branch per byte, because most values have none.
func needsEscape(v string) bool {
	var seen byte
	for i := 0; i < len(v); i++ {
		seen |= escapes[v[i]]
	}
	return seen != 0
}

// AppendPart appends v escaped, or hashed when its escaped form is longer than MaxPart.
func AppendPart(dst []byte, v string) []byte {
	if len(v) <= MaxPart && !needsEscape(v) {
		return append(dst, v...) // the common case: nothing to escape
	}
	n := escapedLen(v)
	if n > MaxPart {
		sum := sha256.Sum256([]byte(v))
		dst = append(dst, '#')
		return hex.AppendEncode(dst, sum[:16])
	}
	for i := 0; i < len(v); i++ {
		if e := escapes[v[i]]; e != 0 {
			dst = append(dst, '\\', e)
		} else {
			dst = append(dst, v[i])
		}
	}
	return dst
}

// AppendSecret appends v hashed, always: '#' and the hex of 128 bits of its SHA-256. API keys
// go through it so that no credential appears in a Redis key name (SCAN, MONITOR, SLOWLOG) or
// in a snapshot. SHA-256 rather than a faster hash because clients choose their keys, and a
// collision would merge two callers' buckets.
func AppendSecret(dst []byte, v string) []byte {
	var sum [32]byte
	if len(v) <= 256 {
		var buf [256]byte // hashing from the stack keeps the hot path free of allocation
		n := copy(buf[:], v)
		sum = sha256.Sum256(buf[:n])
	} else {
		sum = sha256.Sum256([]byte(v))
	}
	dst = append(dst, '#')
	return hex.AppendEncode(dst, sum[:16])
}

// AppendHead appends the part of a key that names the rule: the prefix, the rule's id and its
// version.
func AppendHead(dst []byte, rule, version string) []byte {
	dst = append(dst, Prefix...)
	dst = AppendPart(dst, rule)
	dst = append(dst, ':')
	return AppendPart(dst, version)
}

// AppendTag appends the hash tag of a caller, {kind=value}, where kind names which attribute
// gave the identity (a=api_key, u=user, i=ip), so that all of one caller's limits share a
// Redis hash slot.
func AppendTag(dst []byte, kind byte, identity string) []byte {
	dst = append(dst, ':', '{', kind, '=')
	dst = AppendIdentity(dst, kind, identity)
	return append(dst, '}')
}

// AppendTagPart is AppendTag for an identity already in key form, as AppendIdentity writes
// it: a caller that needs one API key's hash several times computes it once.
func AppendTagPart(dst []byte, kind byte, part []byte) []byte {
	dst = append(dst, ':', '{', kind, '=')
	dst = append(dst, part...)
	return append(dst, '}')
}

// AppendIdentity appends an identity's value: an API key ('a') hashed, anything else escaped.
func AppendIdentity(dst []byte, kind byte, v string) []byte {
	if kind == 'a' && v != "" {
		return AppendSecret(dst, v)
	}
	return AppendPart(dst, v)
}

// AppendValue appends one more part, after a separator.
func AppendValue(dst []byte, v string) []byte {
	return AppendPart(append(dst, ':'), v)
}

// HashTag returns the part of k that decides its Redis hash slot: the text between the first
// '{' and the next '}', or all of k when it has no tag.
func HashTag(k []byte) []byte {
	for i, c := range k {
		if c == '{' {
			for j := i + 1; j < len(k); j++ {
				if k[j] == '}' {
					if j > i+1 {
						return k[i+1 : j]
					}
					return k
				}
			}
			return k
		}
	}
	return k
}

// HashedAPIKey is what counts, traces and logs keep of an API key: its hashed prefix, as
// bucket keys hold it ('#' and 32 hex digits of its SHA-256), so that no credential reaches
// the control store or a trace backend. "" stays "".
func HashedAPIKey(apiKey string) string {
	if apiKey == "" {
		return ""
	}
	var buf [33]byte
	return string(AppendSecret(buf[:0], apiKey))
}

// IsHashedAPIKey reports whether v is in the form HashedAPIKey returns: '#' and 32 lowercase
// hex digits.
func IsHashedAPIKey(v string) bool {
	return len(v) == 33 && v[0] == '#' && strings.Trim(v[1:], "0123456789abcdef") == ""
}

// APIKeyFilter turns a caller's api_key filter into what the counts keep: a hashed prefix
// ('#' and 32 lowercase hex digits) is taken as it is, anything else is a key and is hashed.
func APIKeyFilter(v string) string {
	if IsHashedAPIKey(v) {
		return v
	}
	return HashedAPIKey(v)
}
