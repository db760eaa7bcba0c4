package envoyconf_test

import (
	"fmt"

	"github.com/sluicehq/sluice/policy/envoyconf"
)

func Example() {
	cfg, err := envoyconf.Load(map[string][]byte{"messaging.yaml": []byte(`
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day to any one number.
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  # And 100 messages a day to any unique phone number.
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
`)}, false)
	if err != nil {
		fmt.Println(err)
		return
	}
	entries := []envoyconf.Entry{{Key: "message_type", Value: "marketing"}, {Key: "to_number", Value: "2061111111"}}
	m := cfg.Match("messaging", entries)
	fmt.Println(m.Limit.ID, m.Limit.RequestsPerUnit, "per", m.Limit.Unit)
	m.CounterValues(entries, func(key, value string) { fmt.Printf("  counter part %s=%s\n", key, value) })

	m = cfg.Match("messaging", []envoyconf.Entry{{Key: "message_type", Value: "alert"}})
	fmt.Println(m.Limit == nil)
	// Output:
	// message_type=marketing/to_number 5 per day
	//   counter part message_type=marketing
	//   counter part to_number=2061111111
	// true
}

func ExampleLoad_error() {
	_, err := envoyconf.Load(map[string][]byte{"bad.yaml": []byte(`
domain: d
descriptors:
  - key: k
    rate_limit: {unit: fortnight, requests_per_unit: 1}
`)}, false)
	fmt.Println(err)
	// Output:
	// bad.yaml:5: descriptors[0].rate_limit.unit: invalid unit "fortnight" (want second, minute, hour, day, week, month or year)
}
