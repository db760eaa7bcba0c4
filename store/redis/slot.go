package redis

import "github.com/sluicehq/sluice/internal/key"

// crcTable is CRC-16/XMODEM (polynomial 0x1021), which Redis Cluster hashes keys with.
var crcTable = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

// Slot is the Redis Cluster hash slot of a bucket key: CRC16 of its hash tag, mod 16384.
// Written here rather than taken from a client because the store groups ops by slot before any
// client sees them.
func Slot(k []byte) uint16 {
	var crc uint16
	for _, b := range key.HashTag(k) {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^b]
	}
	return crc % 16384
}
