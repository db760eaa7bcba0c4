package node

import (
	"os"
	"path/filepath"
	"strings"
)

// configMapData is the symlink through which a Kubernetes ConfigMap or Secret volume shows its
// files. The kubelet never writes a visible file in place: it writes the new contents into a
// fresh hidden folder (..2026_11_23_08_00_00.123456789), points a new symlink ..data_tmp at it
// and renames that over ..data, so every file changes at once. The visible names
// (policy.yaml -> ..data/policy.yaml) stay the same symlinks throughout: the only event a
// watcher of the folder sees for an update is ..data being created by that rename.
const configMapData = "..data"

// policyEvent tells whether a change to the file changed, seen by the watcher of the folder
// that holds the policy config (a file or a folder), may change the policy: a YAML file of the
// folder, the file itself, or the swap of a ConfigMap volume's ..data, which changes every
// file of the volume. Other hidden names (editors' swap files, the kubelet's timestamped
// folders and ..data_tmp) are not: the swap that follows them is.
func policyEvent(config, changed string) bool {
	base := filepath.Base(changed)
	if base == configMapData {
		return true
	}
	if strings.HasPrefix(base, ".") {
		return false
	}
	if info, err := os.Stat(config); err == nil && info.IsDir() {
		return strings.HasSuffix(base, ".yaml") || strings.HasSuffix(base, ".yml")
	}
	return filepath.Clean(changed) == filepath.Clean(config)
}
