// formatmap prints what the kubelet writes into a Downward API volume for a
// labels or annotations map: the real k8s.io/kubernetes/pkg/fieldpath
// FormatMap, at the control plane's pinned version. Built inside the module of
// tests/controlplane (which requires k8s.io/kubernetes), so it needs no go.mod
// of its own.
//
// Input on stdin: a JSON list of string maps. Output: a JSON list of the
// formatted files, in the same order.
package main

import (
	"encoding/json"
	"os"

	"k8s.io/kubernetes/pkg/fieldpath"
)

func main() {
	var maps []map[string]string
	if err := json.NewDecoder(os.Stdin).Decode(&maps); err != nil {
		panic(err)
	}
	out := make([]string, len(maps))
	for i, m := range maps {
		out[i] = fieldpath.FormatMap(m)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		panic(err)
	}
}
