package redis

import "testing"

// The expected slots are what CLUSTER KEYSLOT answers (Redis's own test vectors).
func TestSlot(t *testing.T) {
	t.Parallel()
	cases := []struct {
		key  string
		slot uint16
	}{
		{"123456789", 12739}, // the CRC16/XMODEM check value 0x31C3 mod 16384
		{"foo", 12182},
		{"{user1000}.following", 3443}, // only the tag counts
		{"{user1000}.followers", 3443},
		{"foo{}{bar}", 8363}, // empty first tag: the whole key
	}
	for _, c := range cases {
		if got := Slot([]byte(c.key)); got != c.slot {
			t.Errorf("Slot(%q) = %d, want %d", c.key, got, c.slot)
		}
	}
}
